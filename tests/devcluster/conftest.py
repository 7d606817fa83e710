"""Fixtures for the emulated API server tier: one DevCluster per test (it starts in ~50 ms)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

from pd_operator.devcluster import DevCluster

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.pd.dev"},
    "spec": {
        "group": "test.pd.dev",
        "scope": "Namespaced",
        "names": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "shortNames": ["wd"],
            "categories": ["all"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    with DevCluster(namespaces=("default", "other")) as running:
        running.register_crd(WIDGET_CRD)
        yield running


@pytest.fixture
def widget_crd() -> dict[str, Any]:
    return copy.deepcopy(WIDGET_CRD)


@pytest.fixture
def api(cluster: DevCluster) -> Iterator[kubernetes.client.ApiClient]:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=cluster.kubeconfig_path, client_configuration=config)
    config.retries = False  # fault tests want to see each failure, not urllib3's retries
    with kubernetes.client.ApiClient(config) as client:
        yield client


@pytest.fixture
def core(api: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api)


@pytest.fixture
def apps(api: kubernetes.client.ApiClient) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(api)


@pytest.fixture
def custom(api: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api)


@pytest.fixture
def widget() -> Callable[..., dict[str, Any]]:
    """A factory of Widget manifests (the test CRD)."""

    def make(name: str, spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
        return {
            "apiVersion": "test.pd.dev/v1",
            "kind": "Widget",
            "metadata": {"name": name, **meta},
            "spec": spec or {"size": 1},
        }

    return make

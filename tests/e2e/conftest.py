"""The real-cluster tier: runs only when PD_E2E_KUBECONFIG names a kubeconfig.

PD_E2E_OPERATOR=installed uses an operator already running in the cluster (the Helm chart, with
its webhook); otherwise (`local`, the default) the tests run the operator in this process against
the cluster, watching only the test namespace. The CRD is installed if it is missing. Serving
pods need NPUs to become Ready, so the readiness scenarios need PD_E2E_NPU=1.
"""

from __future__ import annotations

import copy
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml
from e2e_support import GROUP, KUBECONFIG, MODE, PLURAL, ROOT, example


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)
            if not KUBECONFIG:
                item.add_marker(pytest.mark.skip(
                    reason="real-cluster tier: set PD_E2E_KUBECONFIG to a kubeconfig to run it"))


@pytest.fixture(scope="session")
def api() -> Iterator[kubernetes.client.ApiClient]:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=KUBECONFIG, client_configuration=config)
    with kubernetes.client.ApiClient(config) as client:
        ext = kubernetes.client.ApiextensionsV1Api(client)
        crd = yaml.safe_load((ROOT / "crds" / f"{GROUP}_{PLURAL}.yaml").read_text())
        try:
            ext.read_custom_resource_definition(crd["metadata"]["name"])
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
            time.sleep(3)  # the API server needs a moment to serve a new CRD
        yield client


@pytest.fixture
def namespace(api: kubernetes.client.ApiClient) -> Iterator[str]:
    core = kubernetes.client.CoreV1Api(api)
    name = f"pd-e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture
def operator(namespace: str) -> Iterator[None]:
    if MODE == "installed":
        yield
        return
    from pd_operator.controller.background import BackgroundOperator
    from pd_operator.controller.main import Options

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    options = Options(namespaces=[namespace], kubeconfig=KUBECONFIG, webhook=False, health_port=port(),
                      metrics_port=port(), drift_interval_s=5.0)
    with BackgroundOperator(options):
        yield


@pytest.fixture
def glm(namespace: str) -> dict[str, Any]:
    doc = copy.deepcopy(example())
    doc["metadata"]["namespace"] = namespace
    return doc

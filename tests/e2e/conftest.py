"""The e2e tier: by default against this run's own control plane, the operator installed with
`helm install` and running as the chart's ServiceAccount; with PD_E2E_KUBECONFIG against that
cluster (see tests/support/e2e.py for the knobs). The CRD is installed there if it is missing.
"""

from __future__ import annotations

import copy
import os
import pathlib
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from pd_operator.api.types import GROUP, PLURAL
from support.cluster import ControlPlane, pick_port, wait_for
from support.e2e import KUBECONFIG, MODE
from support.installed import (
    OperatorProcess,
    Release,
    helm_install,
    helm_uninstall,
    wait_webhook_called,
    weights_claim,
)
from support.specs import ROOT, example

DRIFT = "--drift-interval=1"  # the idle test waits for two drift reconciles


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def launched(request: pytest.FixtureRequest) -> ControlPlane | None:
    """This run's control plane, unless PD_E2E_KUBECONFIG names another cluster."""
    return None if KUBECONFIG else request.getfixturevalue("control_plane")


@pytest.fixture(scope="module")
def kubeconfig(launched: ControlPlane | None) -> str:
    return str(launched.kubeconfig) if launched else str(KUBECONFIG)


@pytest.fixture(scope="module")
def api(kubeconfig: str) -> Iterator[kubernetes.client.ApiClient]:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
    with kubernetes.client.ApiClient(config) as client:
        ext = kubernetes.client.ApiextensionsV1Api(client)
        crd = yaml.safe_load((ROOT / "crds" / f"{GROUP}_{PLURAL}.yaml").read_text())
        name = crd["metadata"]["name"]
        try:
            ext.read_custom_resource_definition(name)
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise
            ext.create_custom_resource_definition(crd)

        def established() -> bool:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)
        wait_for("the CRD established", established, 60)
        yield client


@pytest.fixture(scope="module")
def release(launched: ControlPlane | None,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release | None]:
    """On the launched control plane: the chart, installed once for the module."""
    if launched is None:
        yield None
        return
    installed = helm_install(launched, tmp_path_factory.mktemp("e2e-release"))
    yield installed
    helm_uninstall(launched, installed)  # its configuration fails closed once no operator serves it


@pytest.fixture
def namespace(api: kubernetes.client.ApiClient) -> Iterator[str]:
    core = kubernetes.client.CoreV1Api(api)
    name = f"pd-e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_for("the default ServiceAccount", lambda: core.list_namespaced_service_account(name).items, 60)
    yield name
    core.delete_namespace(name)


@pytest.fixture
def operator(launched: ControlPlane | None, release: Release | None, kubeconfig: str, namespace: str,
             tmp_path: pathlib.Path) -> Iterator[OperatorProcess | None]:
    """The operator serving `namespace`, or None when the cluster's own (MODE=installed) does."""
    if release is not None:
        assert launched is not None
        with release.operator(launched, tmp_path, extra_args=[DRIFT]) as op:
            op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "its webhook configured")
            wait_webhook_called(launched, namespace)
            yield op
        return
    if MODE == "installed":
        yield None
        return
    program = pathlib.Path(sys.executable).parent / "pd-operator"
    argv = [str(program), "run", f"--namespace={namespace}", "--no-webhook", f"--kubeconfig={kubeconfig}",
            f"--health-port={pick_port()}", f"--metrics-port={pick_port()}", DRIFT]
    with OperatorProcess(argv, dict(os.environ), tmp_path / "operator.log") as op:
        op.wait_health(lambda _: True, "the operator serving /healthz")
        yield op


@pytest.fixture
def glm(namespace: str, launched: ControlPlane | None) -> dict[str, Any]:
    doc = copy.deepcopy(example())
    doc["metadata"]["namespace"] = namespace
    claim = weights_claim(doc)
    if launched is not None and claim:
        launched.create_weights_volume(namespace, claim)  # what the example says to create first
    return doc

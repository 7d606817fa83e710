"""The controller's scenarios through the Kubernetes Python client, against this run's control
plane (the chart installed) or the cluster PD_E2E_KUBECONFIG names (see conftest.py)."""

from __future__ import annotations

import kubernetes
import pytest

from pd_operator.api.types import GROUP, PLURAL, VERSION
from support.cluster import wait_for
from support.e2e import MODE, NPU, WAIT_S
from support.specs import example

pytestmark = pytest.mark.e2e

CHILDREN = {("StatefulSet", "glm-flash-prefill-0"), ("StatefulSet", "glm-flash-decode-0"),
            ("Service", "glm-flash-prefill-0"), ("Service", "glm-flash-decode-0"),
            ("Service", "glm-flash-proxy"), ("Deployment", "glm-flash-proxy")}


def _custom(api):
    return kubernetes.client.CustomObjectsApi(api)


def _pdd(api, namespace, name="glm-flash") -> dict:
    return _custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def _condition(api, namespace, type_, name="glm-flash"):
    for c in (_pdd(api, namespace, name).get("status") or {}).get("conditions", []):
        if c["type"] == type_:
            return c["status"], c["reason"]
    return None


def _children(api, namespace) -> dict[tuple[str, str], dict]:
    selector = "pd.serving.dev/deployment=glm-flash"
    apps, core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)
    out = {}
    lists = (("StatefulSet", apps.list_namespaced_stateful_set),
             ("Deployment", apps.list_namespaced_deployment), ("Service", core.list_namespaced_service))
    for kind, list_kind in lists:
        items = list_kind(namespace, label_selector=selector)
        for obj in api.sanitize_for_serialization(items)["items"]:
            out[(kind, obj["metadata"]["name"])] = obj
    return out


def _spec_versions(api, namespace) -> dict:
    """What changes only when someone writes the spec: generation, or resourceVersion for Services."""
    return {k: v["metadata"].get("generation") or v["metadata"]["resourceVersion"]
            for k, v in _children(api, namespace).items()}


def _create(api, namespace, doc):
    return _custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)


def test_children_are_created_owned_and_left_alone_when_idle(api, namespace, operator, glm):
    if operator is None:
        pytest.skip("PD_E2E_OPERATOR=installed: the cluster's operator exposes no metrics here to "
                    "tell when it reconciled")
    _create(api, namespace, glm)
    wait_for("children", lambda: set(_children(api, namespace)) >= CHILDREN, WAIT_S)
    uid = _pdd(api, namespace)["metadata"]["uid"]
    for obj in _children(api, namespace).values():
        assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid]
    wait_for("KVCompatible", lambda: _condition(api, namespace, "KVCompatible") == ("True", "Compatible"),
             WAIT_S)
    before = _spec_versions(api, namespace)
    drifts = operator.metric("pd_operator_reconcile_total", trigger="drift")
    wait_for("two drift reconciles",
             lambda: operator.metric("pd_operator_reconcile_total", trigger="drift") >= drifts + 2, WAIT_S)
    assert _spec_versions(api, namespace) == before


def test_incompatible_manifest_is_rejected_or_reported(api, namespace, operator):
    doc = example("incompatible-glm-tp8-tp3.yaml")
    doc["metadata"]["namespace"] = namespace
    if MODE == "installed":  # the chart's webhook refuses it
        with pytest.raises(kubernetes.client.ApiException) as err:
            _create(api, namespace, doc)
        assert "spec.decode.tensorParallelSize" in err.value.body
        return
    _create(api, namespace, doc)
    name = doc["metadata"]["name"]
    wait_for("KVCompatible=False",
             lambda: _condition(api, namespace, "KVCompatible", name) == ("False", "HeadsNotDivisibleByTP"),
             WAIT_S)
    assert _children(api, namespace) == {}


def test_deleted_child_is_restored(api, namespace, operator, glm):
    _create(api, namespace, glm)
    wait_for("children", lambda: set(_children(api, namespace)) >= CHILDREN, WAIT_S)
    core = kubernetes.client.CoreV1Api(api)
    old = core.read_namespaced_service("glm-flash-decode-0", namespace).metadata.uid
    core.delete_namespaced_service("glm-flash-decode-0", namespace)
    wait_for("service restored",
             lambda: (svc := _children(api, namespace).get(("Service", "glm-flash-decode-0")))
             and svc["metadata"]["uid"] != old, WAIT_S)


@pytest.mark.skipif(not NPU, reason="serving pods need NPU nodes (PD_E2E_NPU=1)")
def test_ready(api, namespace, operator, glm):
    _create(api, namespace, glm)
    wait_for("Ready", lambda: _condition(api, namespace, "Ready") == ("True", "Serving"), 3600)

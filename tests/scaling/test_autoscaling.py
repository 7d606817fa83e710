"""Autoscaling on the real control plane: the HPA the operator renders for decode, driven by a custom
metrics API the test controls (tests/support/metrics_api.py, registered with an APIService), scales
the decode PDRole up and down through its /scale, and the decode StatefulSets follow.

Only the conditions are waited for (generous deadlines); nothing asserts how long a step took.
"""

from __future__ import annotations

import copy
import json
import urllib.parse
from collections.abc import Iterator

import pytest
import yaml

from pd_operator.api.types import GROUP, VERSION
from pd_operator.controller.diff import holds
from pd_operator.render import render
from pd_operator.render.proxy import members
from support.cluster import ApiError, ControlPlane, service_account_user, wait_for
from support.installed import weights_claim
from support.kube import kubectl
from support.metrics_api import MetricsAPI
from support.specs import example, resolve

pytestmark = [pytest.mark.integration, pytest.mark.scaling]

GLM = "glm-flash"
DECODE_ROLE = f"{GLM}-decode"
KV_USAGE = "vllm_kv_cache_usage_perc"  # what the HPA asks for vllm:kv_cache_usage_perc
HPA_USER = service_account_user("kube-system", "horizontal-pod-autoscaler")
TIMEOUT_S = 180
AUTOSCALING = {"minReplicas": 1, "maxReplicas": 2,
               "metrics": [{"metric": "vllm:kv_cache_usage_perc", "averageValue": 0.5}],
               # No waiting: the test moves the metric once in each direction.
               "scaleUp": {"stabilizationWindowSeconds": 0},
               "scaleDown": {"stabilizationWindowSeconds": 0, "maxInstances": 1, "periodSeconds": 15}}


@pytest.fixture(scope="module")
def metrics_api(control_plane: ControlPlane) -> Iterator[MetricsAPI]:
    with MetricsAPI(control_plane) as api:
        yield api


def _get(cp: ControlPlane, path: str) -> dict | None:
    try:
        return dict(cp.api("GET", path))
    except ApiError as err:
        if err.status == 404:
            return None
        raise


def _hpa(cp: ControlPlane, namespace: str) -> dict | None:
    return _get(cp, f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{DECODE_ROLE}")


def _pdrole(cp: ControlPlane, namespace: str) -> dict | None:
    return _get(cp, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/pdroles/{DECODE_ROLE}")


def _instances(cp: ControlPlane, namespace: str) -> int | None:
    """The decode PDRole's spec.replicas: the count the HPA writes through /scale."""
    return ((_pdrole(cp, namespace) or {}).get("spec") or {}).get("replicas")


def _decode_sets(cp: ControlPlane, namespace: str) -> set[str]:
    selector = urllib.parse.quote(f"pd.serving.dev/deployment={GLM},pd.serving.dev/role=decode")
    path = f"/apis/apps/v1/namespaces/{namespace}/statefulsets?labelSelector={selector}"
    items = cp.api("GET", path)["items"]
    return {s["metadata"]["name"] for s in items if not s["metadata"].get("deletionTimestamp")}


def _routed_decode(cp: ControlPlane, namespace: str) -> set[str]:
    """The decode instances the proxy's membership ConfigMap lists."""
    config_map = _get(cp, f"/api/v1/namespaces/{namespace}/configmaps/{GLM}-proxy") or {}
    routes = members(config_map) if config_map else None
    return {u.name for u in routes.decode} if routes else set()


def _hpa_condition(cp: ControlPlane, namespace: str, kind: str) -> tuple[str, str] | None:
    hpa = _hpa(cp, namespace) or {}
    found = next((c for c in hpa.get("status", {}).get("conditions", []) if c["type"] == kind), None)
    return (found["status"], found["reason"]) if found else None


def _wait(what: str, check, cp: ControlPlane, namespace: str) -> None:  # type: ignore[no-untyped-def]
    try:
        wait_for(what, check, TIMEOUT_S, interval=0.5)
    except TimeoutError:
        hpa = _hpa(cp, namespace)
        raise AssertionError(f"{what}: not reached. HPA status: "
                             f"{json.dumps((hpa or {}).get('status'), indent=1)}\n"
                             f"PDRole: {json.dumps(_pdrole(cp, namespace), indent=1)}") from None


def _apply(cp: ControlPlane, doc: dict) -> None:
    claim, namespace = weights_claim(doc), doc["metadata"]["namespace"]
    if claim and not cp.exists(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"):
        cp.create_weights_volume(namespace, claim)
    kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc))


def test_custom_metrics_reach_a_client_through_the_api_server(control_plane, namespace, metrics_api):
    cp = control_plane
    for name, role in (("a-0", "decode"), ("b-0", "decode"), ("c-0", "prefill")):
        cp.api("POST", f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"role": role}},
            "spec": {"containers": [{"name": "c", "image": "none"}]}})
    metrics_api.set(namespace, KV_USAGE, 0.25, pods={"b-0": 0.875})
    answer = cp.api("GET", MetricsAPI.path(namespace, KV_USAGE, "role=decode"))
    assert answer["kind"] == "MetricValueList"
    assert {(i["describedObject"]["name"], i["value"]) for i in answer["items"]} == {("a-0", "250m"),
                                                                                     ("b-0", "875m")}
    # The request came through the aggregator (its front-proxy certificate), naming the caller.
    (asked,) = metrics_api.asked(KV_USAGE, namespace)
    assert (asked.user, asked.selector) == ("admin", "role=decode")
    # A metric nobody set is a 404, as an adapter answers for a series it does not have.
    with pytest.raises(ApiError) as missing:
        cp.api("GET", MetricsAPI.path(namespace, "vllm_num_requests_running", "role=decode"))
    assert missing.value.status == 404


def test_rendered_hpas_read_back_as_rendered(control_plane, namespace):
    """The API server stores the HPAs unchanged (quantities in canonical form, behavior as given), so
    the planner never sees drift in them and the operator never re-applies them."""
    cp = control_plane
    doc = example(namespace=namespace)
    doc["spec"]["prefill"]["autoscaling"] = {
        "maxReplicas": 8, "metrics": [{"metric": "vllm:num_requests_waiting", "averageValue": 48000},
                                      {"metric": "vllm:time_to_first_token_seconds", "averageValue": 1.5}],
        "scaleUp": {"stabilizationWindowSeconds": 30, "maxInstances": 2, "periodSeconds": 120}}
    doc["spec"]["decode"]["autoscaling"] = {
        "maxReplicas": 4, "metrics": [{"metric": "vllm:kv_cache_usage_perc", "averageValue": 0.7},
                                      {"metric": "vllm:num_requests_running", "averageValue": 2}]}
    rendered = [m for m in render(resolve(doc)) if m["kind"] == "HorizontalPodAutoscaler"]
    assert len(rendered) == 2
    for hpa in rendered:
        path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
        cp.api("POST", path, hpa)
        stored = cp.api("GET", f"{path}/{hpa['metadata']['name']}")
        assert holds(stored, hpa), (json.dumps(stored["spec"]), json.dumps(hpa["spec"]))


def test_the_hpa_scales_decode_on_kv_cache_usage(control_plane, namespace, release, start_operator,
                                                  metrics_api):
    cp = control_plane
    start_operator()
    doc = example(namespace=namespace)
    doc["spec"]["decode"]["autoscaling"] = copy.deepcopy(AUTOSCALING)
    metrics_api.set(namespace, KV_USAGE, 0.25)  # below target: no reason to scale yet
    _apply(cp, doc)

    _wait("the decode HPA", lambda: _hpa(cp, namespace), cp, namespace)
    hpa = _hpa(cp, namespace)
    assert hpa is not None
    (owner,) = hpa["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("PDDeployment", GLM, True)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PDRole",
                                             "name": DECODE_ROLE}
    mark = cp.audit.mark()
    _wait("the HPA reading decode's metric", lambda: _hpa_condition(cp, namespace, "ScalingActive")
          == ("True", "ValidMetricFound"), cp, namespace)
    assert _decode_sets(cp, namespace) == {f"{GLM}-decode-0"}

    # Load: 0.9 on the one decode instance is 1.8x the target -> 2 instances (maxReplicas).
    metrics_api.set(namespace, KV_USAGE, 0.9)
    _wait("decode PDRole at 2", lambda: _instances(cp, namespace) == 2, cp, namespace)
    scale_writes = [e for e in cp.audit.events(mark, user=HPA_USER, namespace=namespace)
                    if e.resource == "pdroles/scale" and e.write]
    assert scale_writes and all(e.name == DECODE_ROLE and e.code == 200 for e in scale_writes)
    _wait("a second decode StatefulSet", lambda: _decode_sets(cp, namespace)
          == {f"{GLM}-decode-0", f"{GLM}-decode-1"}, cp, namespace)
    _wait("the proxy routing to both", lambda: _routed_decode(cp, namespace)
          == {f"{GLM}-decode-0", f"{GLM}-decode-1"}, cp, namespace)
    # The HPA asked for the role's pods through the PDRole's selector: one leader per instance.
    selectors = {a.selector for a in metrics_api.asked(KV_USAGE, namespace) if a.user == HPA_USER}
    assert selectors and all("apps.kubernetes.io/pod-index=0" in s and "pd.serving.dev/role=decode" in s
                             for s in selectors)

    # Idle: 0.1 is 0.2x the target -> back to minReplicas.
    metrics_api.set(namespace, KV_USAGE, 0.1)
    _wait("decode PDRole back at 1", lambda: _instances(cp, namespace) == 1, cp, namespace)
    _wait("one decode StatefulSet", lambda: _decode_sets(cp, namespace) == {f"{GLM}-decode-0"}, cp, namespace)
    assert _routed_decode(cp, namespace) == {f"{GLM}-decode-0"}
    # Quantities and behavior are rendered as the API server stores them: nothing the operator
    # applied to the HPA read back as drift through the scale events' reconciles.
    hpa_writes = [str(e) for e in cp.audit.events(mark, user=release.user, namespace=namespace)
                  if e.resource == "horizontalpodautoscalers" and e.write]
    assert hpa_writes == []

    # Autoscaling removed: the HPA is pruned like any child the spec no longer wants.
    kubectl(cp.kubeconfig, "patch", "pdd", GLM, "-n", namespace, "--type=json",
            "-p", json.dumps([{"op": "remove", "path": "/spec/decode/autoscaling"}]))
    _wait("the HPA pruned", lambda: _hpa(cp, namespace) is None, cp, namespace)

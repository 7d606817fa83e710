"""The operator on the real control plane (tests/support), installed with `helm install` and run
with the chart's arguments as the chart's ServiceAccount: the scenarios of the controller's
contract. The StatefulSet and Deployment controllers create the pods, the scheduler binds them to
kwok NPU nodes, kwok runs them, the garbage collector deletes children; writes are counted from
the API server's audit log."""

from __future__ import annotations

import json

import pytest

from pd_operator.api.labels import DEPLOYMENT, GROUP_RESTARTS, KV_LAYOUT, ROLE
from pd_operator.api.types import GROUP, PLURAL, VERSION
from pd_operator.controller.admission import UPDATE_NOTE
from pd_operator.controller.links import LINK_CONTAINER
from support.cluster import ControlPlane, wait_for
from support.faultproxy import FaultProxy
from support.installed import condition, get_pdd
from support.kube import kubectl
from support.pdd_cluster import (
    GLM,
    GLM_CHILDREN,
    PROXY_PATH,
    READY_TIMEOUT_S,
    apply,
    children,
    cond,
    config_map_model,
    create_glm_config,
    events,
    glm,
    operator_writes,
    patch_spec,
    pods,
    refs,
    routes,
    serve,
    wait_cond,
)
from support.specs import example

pytestmark = pytest.mark.integration


def test_glm_example_converges_to_ready_and_then_writes_nothing(control_plane, namespace, release,
                                                                start_operator):
    cp = control_plane
    op = start_operator("--drift-interval=1")
    apply(cp, glm(namespace))
    wait_for("all children", lambda: refs(children(cp, namespace)) == GLM_CHILDREN, READY_TIMEOUT_S)
    uid = get_pdd(cp, namespace, GLM)["metadata"]["uid"]
    for obj in children(cp, namespace).values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["controller"], ref["kind"]) == (uid, True, "PDDeployment")
    wait_cond(cp, namespace, "KVCompatible", ("True", "Compatible"))

    serve(cp, namespace)
    status = get_pdd(cp, namespace, GLM)["status"]
    assert status["prefill"]["shape"] == "1xTP8" and status["decode"]["shape"] == "1xDP2xTP4"
    assert status["kvLayout"]["prefillBlockSize"] == 640 and status["kvLayout"]["decodeBlockSize"] == 1152
    # The pods are the workload controllers', bound by the scheduler to NPU nodes.
    running = pods(cp, namespace)
    assert len(running) == 3 and all(p["spec"].get("nodeName") for p in running)
    assert {p["metadata"]["ownerReferences"][0]["kind"] for p in running} == {"StatefulSet", "ReplicaSet"}
    wait_for("Ready gauge", lambda: op.metric("pd_operator_pddeployment_ready", namespace=namespace,
                                              name=GLM) == 1.0)
    assert op.health()

    wait_cond(cp, namespace, "Progressing", ("False", "Complete"))
    mark = cp.audit.mark()
    drifts = op.metric("pd_operator_reconcile_total", trigger="drift")
    pokes = op.metric("pd_operator_reconcile_total", trigger="child")
    # A change by someone else to a field the operator does not set pokes a reconcile too.
    kubectl(cp.kubeconfig, "annotate", "service", "glm-flash-proxy", "-n", namespace, "team=llm")
    wait_for("a reconcile after the annotation",
             lambda: op.metric("pd_operator_reconcile_total", trigger="child") > pokes)
    wait_for("two drift reconciles", lambda: op.metric("pd_operator_reconcile_total", trigger="drift")
             >= drifts + 2)
    assert operator_writes(cp, mark, release.user, namespace) == []
    assert len(events(cp, namespace, "Serving")) == 1 and len(events(cp, namespace, "Compatible")) == 1

    # No finalizer: deletion needs no operator; the garbage collector takes the children along.
    assert not get_pdd(cp, namespace, GLM)["metadata"].get("finalizers")
    kubectl(cp.kubeconfig, "delete", "pdd", GLM, "-n", namespace)
    wait_for("children collected with their owner", lambda: children(cp, namespace) == {}, READY_TIMEOUT_S)


def test_model_config_from_a_config_map(control_plane, namespace, start_operator):
    cp = control_plane
    start_operator("--drift-interval=1")  # nothing of ours changes when the ConfigMap appears
    applied = apply(cp, config_map_model(namespace))
    assert "spec.model.hfConfigMap" in applied.stderr  # the webhook's warning, shown by kubectl
    wait_cond(cp, namespace, "KVCompatible", ("False", "ConfigMapNotFound"))
    assert children(cp, namespace) == {}
    create_glm_config(cp, namespace)
    wait_cond(cp, namespace, "KVCompatible", ("True", "Compatible"))
    wait_for("children", lambda: refs(children(cp, namespace)) == GLM_CHILDREN, READY_TIMEOUT_S)
    assert get_pdd(cp, namespace, GLM)["status"]["kvLayout"]["decodeBlockSize"] == 1152
    serve(cp, namespace)


def test_webhook_refuses_incompatible_create_and_update_over_the_api_server(control_plane, namespace,
                                                                          release, start_operator):
    cp = control_plane
    start_operator()
    bad = glm(namespace, example("incompatible-glm-tp8-tp3.yaml"))
    refused = apply(cp, bad, check=False)
    assert refused.returncode != 0 and "denied the request" in refused.stderr, refused.stderr
    assert "spec.decode.tensorParallelSize: " in refused.stderr and UPDATE_NOTE not in refused.stderr
    assert not cp.exists(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/glm-flash-bad")

    created = apply(cp, glm(namespace))
    assert "Warning: spec.decode.blockSize" in created.stderr, created.stderr  # admitted, with warnings
    serve(cp, namespace)
    mark = cp.audit.mark()
    update = patch_spec(cp, namespace, {"decode": {"tensorParallelSize": 3, "dataParallelSize": 1}},
                        check=False)
    assert update.returncode != 0 and "spec.decode.tensorParallelSize: " in update.stderr, update.stderr
    assert UPDATE_NOTE in update.stderr
    assert get_pdd(cp, namespace, GLM)["spec"]["decode"]["tensorParallelSize"] == 4
    reviews = [e for e in cp.audit.events(mark, verb="patch", resource=PLURAL, namespace=namespace)]
    assert [e.code for e in reviews] == [422], [str(e) for e in reviews]


def test_incompatible_spec_the_webhook_cannot_judge_creates_nothing(control_plane, namespace, start_operator):
    cp = control_plane
    start_operator()
    create_glm_config(cp, namespace)
    doc = config_map_model(namespace)
    doc["spec"]["decode"].update(tensorParallelSize=3, dataParallelSize=1)
    apply(cp, doc)  # admitted: the KV check needs the ConfigMap, which only the controller reads
    wait_cond(cp, namespace, "KVCompatible", ("False", "HeadsNotDivisibleByTP"))
    assert children(cp, namespace) == {}
    warning = wait_for("the Warning event", lambda: events(cp, namespace, "HeadsNotDivisibleByTP"))
    assert warning[0]["type"] == "Warning" and "spec.decode.tensorParallelSize" in warning[0]["message"]


def test_invalid_update_keeps_children_and_a_fix_or_scale_down_applies(control_plane, namespace, release,
                                                                       start_operator):
    cp = control_plane
    start_operator()
    create_glm_config(cp, namespace)
    doc = config_map_model(namespace)
    doc["spec"]["decode"]["replicas"] = 2
    apply(cp, doc)
    wait_for("children", lambda: "StatefulSet/glm-flash-decode-1" in children(cp, namespace), READY_TIMEOUT_S)
    serve(cp, namespace)
    before = {k: v["metadata"]["uid"] for k, v in children(cp, namespace).items()}
    mark = cp.audit.mark()

    patch_spec(cp, namespace, {"decode": {"tensorParallelSize": 3, "dataParallelSize": 1}})
    wait_cond(cp, namespace, "KVCompatible", ("False", "HeadsNotDivisibleByTP"))
    assert cond(cp, namespace, "Ready") == ("False", "HeadsNotDivisibleByTP")
    assert {k: v["metadata"]["uid"] for k, v in children(cp, namespace).items()} == before
    assert operator_writes(cp, mark, release.user, namespace, children_only=True) == []
    assert get_pdd(cp, namespace, GLM)["status"]["kvLayout"]["decodeBlockSize"] == 1152  # the running layout
    assert len(pods(cp, namespace, f"{ROLE}=decode")) == 2  # still serving

    patch_spec(cp, namespace, {"decode": {"tensorParallelSize": 4, "dataParallelSize": 2, "replicas": 1}})
    wait_for("prune", lambda: "StatefulSet/glm-flash-decode-1" not in children(cp, namespace),
             READY_TIMEOUT_S)
    assert "Service/glm-flash-decode-1" not in children(cp, namespace)
    serve(cp, namespace)


def test_deleted_or_hand_edited_child_is_restored_and_foreign_one_left_alone(control_plane, namespace,
                                                                              start_operator):
    cp = control_plane
    start_operator()
    apply(cp, glm(namespace))
    wait_for("children", lambda: refs(children(cp, namespace)) == GLM_CHILDREN, READY_TIMEOUT_S)
    old = children(cp, namespace)["Service/glm-flash-decode-0"]["metadata"]["uid"]
    kubectl(cp.kubeconfig, "delete", "service", "glm-flash-decode-0", "-n", namespace)
    wait_for("service restored", lambda: (children(cp, namespace).get("Service/glm-flash-decode-0")
                                          or {"metadata": {"uid": old}})["metadata"]["uid"] != old)

    image = children(cp, namespace)["StatefulSet/glm-flash-prefill-0"]["spec"]["template"]["spec"][
        "containers"][0]["image"]
    kubectl(cp.kubeconfig, "set", "image", "statefulset/glm-flash-prefill-0", "vllm=busybox", "-n", namespace)

    def image_back() -> bool:
        sts = children(cp, namespace)["StatefulSet/glm-flash-prefill-0"]
        return bool(sts["spec"]["template"]["spec"]["containers"][0]["image"] == image)
    wait_for("the hand edit undone", image_back)

    foreign = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "hand-made", "labels": {DEPLOYMENT: GLM}}, "data": {}}
    cp.api("POST", f"/api/v1/namespaces/{namespace}/configmaps", foreign)
    wait_cond(cp, namespace, "Degraded", ("True", "ForeignChild"))
    assert cp.exists(f"/api/v1/namespaces/{namespace}/configmaps/hand-made")


def _fail(cp: ControlPlane, namespace: str, name: str, how: str) -> None:
    """Report a failure in the pod's status as a kubelet does: a container that crashed and was
    restarted in place, or the whole pod Failed (evicted). kwok's stages only move Pending pods to
    Running and delete deleted ones, so nothing of the cluster rewrites it."""
    pod = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    if how == "pod-failed":
        status = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."}
    else:
        statuses = pod["status"]["containerStatuses"]
        for container in statuses:
            started = container["state"]["running"]["startedAt"]
            container.update(restartCount=1, ready=False, lastState={"terminated": {
                "exitCode": 1, "reason": "Error", "startedAt": started, "finishedAt": started}})
        status = {"containerStatuses": statuses}
    cp.api("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status},
           content_type="application/merge-patch+json")


@pytest.mark.parametrize("how", ["container-restart", "pod-failed"])
def test_failed_rank_restarts_its_whole_group(control_plane, namespace, release, start_operator, how):
    cp = control_plane
    start_operator()
    doc = glm(namespace)
    doc["spec"]["decode"]["npusPerNode"] = 4  # DP2 x TP4 on 4 NPUs a pod: two pods per decode instance
    apply(cp, doc)
    serve(cp, namespace)
    decode = f"{ROLE}=decode"
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cp, namespace, decode)}
    assert sorted(uids) == ["glm-flash-decode-0-0", "glm-flash-decode-0-1"]
    prefill = f"/api/v1/namespaces/{namespace}/pods/glm-flash-prefill-0-0"
    prefill_uid = cp.api("GET", prefill)["metadata"]["uid"]

    mark = cp.audit.mark()
    _fail(cp, namespace, "glm-flash-decode-0-1", how)

    def recreated() -> bool:
        now = pods(cp, namespace, decode)
        return len(now) == 2 and all(p["metadata"]["uid"] != uids[p["metadata"]["name"]] for p in now)
    wait_for("both decode pods recreated", recreated, READY_TIMEOUT_S)
    after = cp.audit.events(mark, namespace=namespace)
    # The healthy rank went because the operator deleted it.
    deleted = [i for i, e in enumerate(after) if e.verb == "delete" and e.name == "glm-flash-decode-0-0"]
    assert deleted and after[deleted[0]].user == release.user, [str(e) for e in after if e.verb == "delete"]
    # Until the failed pod is deleted (a new one of its name follows), kwok left its status alone.
    gone = next(i for i, e in enumerate(after) if e.verb == "delete" and e.name == "glm-flash-decode-0-1")
    rewrites = [str(e) for e in after[:gone]
                if e.user == "kwok" and e.resource == "pods/status" and e.name == "glm-flash-decode-0-1"]
    assert not rewrites, "kwok rewrote the failed pod's status"
    assert cp.api("GET", prefill)["metadata"]["uid"] == prefill_uid
    sts = cp.api("GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets/glm-flash-decode-0")
    assert len(sts["metadata"]["annotations"][GROUP_RESTARTS].split(",")) == 1
    restarts = wait_for("the GroupRestart event", lambda: events(cp, namespace, "GroupRestart"))
    assert len(restarts) == 1 and "glm-flash-decode-0-1" in restarts[0]["message"]
    serve(cp, namespace)


def test_operator_killed_mid_reconcile_converges_without_duplicates(control_plane, namespace, start_operator):
    cp = control_plane
    with FaultProxy(cp) as proxy:
        first = start_operator(server=proxy.url)
        # SIGKILL right after the API server applied the first ConfigMap, before the operator hears
        # back: the rest of the first wave may land, the workloads (the second wave) do not.
        # Counted in this namespace only: the operator serves every namespace, and an earlier
        # test's deployment, still terminating, may be reconciled first.
        killed = proxy.on_write(1, lambda _: first.kill(), verb="patch", resource="configmaps",
                                namespace=namespace)
        apply(cp, glm(namespace))
        assert killed.wait(READY_TIMEOUT_S), "the operator never applied a ConfigMap"
    partial = refs(children(cp, namespace))
    assert partial and partial < GLM_CHILDREN, partial

    start_operator()
    wait_for("all children after restart", lambda: refs(children(cp, namespace)) == GLM_CHILDREN,
             READY_TIMEOUT_S)
    serve(cp, namespace)
    for obj in children(cp, namespace).values():
        assert len(obj["metadata"]["ownerReferences"]) == 1
    running = pods(cp, namespace)
    assert len(running) == len({p["metadata"]["name"] for p in running}) == 3
    lines = [json.loads(line) for line in first.output().splitlines() if line.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)


def test_kv_layout_rollout_never_routes_across_layouts(control_plane, namespace, start_operator):
    cp = control_plane
    start_operator()
    apply(cp, glm(namespace))
    serve(cp, namespace)
    old_layout = get_pdd(cp, namespace, GLM)["status"]["kvLayout"]["hash"]
    # A new image is a new KV layout. With 1 prefill and 1 decode instance replaced in place
    # (maxUnavailable 1, no surge; the defaults would surge first), both leave the membership to be
    # replaced; with the StatefulSet controller stopped no pod of the new layout comes back, so the
    # proxy routes to nothing (never an old instance with a new one) until pods of the new layout
    # are Ready.
    manager = cp.components["kube-controller-manager"]
    manager.stop()
    try:
        image = "registry.example.com/pd-operator/pd-vllm-ascend:v0.30.0rc2-seed-b"  # a rebuilt image
        in_place = {"rollout": {"maxUnavailable": 1, "maxSurge": 0}}
        patch_spec(cp, namespace, {"image": {"name": image}, "prefill": in_place, "decode": in_place})

        def proxy_gated() -> bool:
            status = get_pdd(cp, namespace, GLM).get("status") or {}
            return (condition({"status": status}, "Progressing").get("reason") == "RolloutInProgress"
                    and status["kvLayout"]["hash"] != old_layout
                    and routes(cp, namespace) == ([], []))
        wait_for("RolloutInProgress with no upstream in the proxy's membership", proxy_gated,
                 READY_TIMEOUT_S)
        assert cond(cp, namespace, "ProxyReady") == ("False", "NoUpstreams")
        assert cp.api("GET", PROXY_PATH.format(namespace))["spec"]["replicas"] == 1, "the proxy stays up"
    finally:
        manager.start()
    serve(cp, namespace)
    assert routes(cp, namespace) == (["glm-flash-prefill-0"], ["glm-flash-decode-0"])
    new_layout = get_pdd(cp, namespace, GLM)["status"]["kvLayout"]["hash"]
    assert {p["metadata"]["labels"][KV_LAYOUT]
            for p in pods(cp, namespace, f"{ROLE} in (prefill,decode)")} == {new_layout}


def _kv_link(cp: ControlPlane, namespace: str, pod: str, ready: bool) -> None:
    """Report the pod's kv-link container (un)ready, as the kubelet does when its readiness probe
    (the gate's verdict) changes; the pod's Ready follows. kwok leaves a Running pod's status alone."""
    current = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")["status"]
    statuses = current["containerStatuses"]
    for container in statuses:
        if container["name"] == LINK_CONTAINER:
            container["ready"] = ready
    conditions = [{**c, "status": "True" if ready else "False"}
                  if c["type"] in ("Ready", "ContainersReady") else c for c in current["conditions"]]
    cp.api("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod}/status",
           {"status": {"containerStatuses": statuses, "conditions": conditions}},
           content_type="application/merge-patch+json")


def test_a_broken_kv_link_takes_the_decode_instance_out_of_the_proxy(control_plane, namespace,
                                                                     start_operator):
    cp = control_plane
    start_operator()
    apply(cp, glm(namespace))
    serve(cp, namespace)
    assert get_pdd(cp, namespace, GLM)["status"]["kvLinks"] == [
        {"decode": "glm-flash-decode-0", "prefill": "glm-flash-prefill-0", "linked": True}]
    proxy = cp.api("GET", PROXY_PATH.format(namespace))
    _kv_link(cp, namespace, "glm-flash-decode-0-0", False)

    def routed_around() -> bool:
        return (cond(cp, namespace, "DecodeReady") == ("False", "KVLinkNotReady")
                and routes(cp, namespace) == (["glm-flash-prefill-0"], []))
    wait_for("DecodeReady KVLinkNotReady with decode out of the proxy's membership", routed_around,
             READY_TIMEOUT_S)
    assert cond(cp, namespace, "Ready") == ("False", "KVLinkNotReady")
    assert cond(cp, namespace, "ProxyReady") == ("False", "NoUpstreams")
    assert [e["linked"] for e in get_pdd(cp, namespace, GLM)["status"]["kvLinks"]] == [False]
    _kv_link(cp, namespace, "glm-flash-decode-0-0", True)
    serve(cp, namespace)
    assert routes(cp, namespace) == (["glm-flash-prefill-0"], ["glm-flash-decode-0"])
    # Gating edited the membership only: the proxy Deployment was never written.
    after = cp.api("GET", PROXY_PATH.format(namespace))
    assert after["metadata"]["generation"] == proxy["metadata"]["generation"]

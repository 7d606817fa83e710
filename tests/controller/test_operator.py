"""The real operator (`main.run`, as `pd-operator run` starts it) against the emulated API server
with the generated CRD: the scenarios of the controller's contract, a few seconds each."""

from __future__ import annotations

import copy
import json
import socket
import ssl
import subprocess
import sys
import urllib.request

import kubernetes
import pytest
from controller_support import API, ROOT, example, wait_for

from pd_operator.controller.restarts import HISTORY
from pd_operator.localnet import free_port

pytestmark = pytest.mark.integration

NS = "default"
KINDS = [("v1", "Service"), ("apps/v1", "StatefulSet"), ("apps/v1", "Deployment"),
         ("networking.k8s.io/v1", "NetworkPolicy"), ("policy/v1", "PodDisruptionBudget"), ("v1", "ConfigMap")]
GLM_CHILDREN = {"ConfigMap/glm-flash-serving",
                "Service/glm-flash-prefill-0", "Service/glm-flash-decode-0", "Service/glm-flash-proxy",
                "StatefulSet/glm-flash-prefill-0", "StatefulSet/glm-flash-decode-0",
                "Deployment/glm-flash-proxy", "NetworkPolicy/glm-flash-kv",
                "PodDisruptionBudget/glm-flash-prefill", "PodDisruptionBudget/glm-flash-decode"}


def children(cluster, name="glm-flash") -> dict[str, dict]:
    out = {}
    for api, kind in KINDS:
        for obj in cluster.list(api, kind, NS, f"pd.serving.dev/deployment={name}"):
            out[f"{kind}/{obj['metadata']['name']}"] = obj
    return out


def pdd(cluster, name="glm-flash") -> dict:
    return cluster.get(API, "PDDeployment", NS, name)


def condition(cluster, type_, name="glm-flash") -> tuple[str, str] | None:
    for c in (pdd(cluster, name).get("status") or {}).get("conditions", []):
        if c["type"] == type_:
            return c["status"], c["reason"]
    return None


def ready_all_pods(cluster) -> int:
    """Mark every not-ready pod Ready (as kubelets would once engines load); how many changed."""
    changed = 0
    for pod in cluster.list("v1", "Pod", NS):
        conds = pod.get("status", {}).get("conditions", [])
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
            cluster.set_pod_ready(NS, pod["metadata"]["name"], True)
            changed += 1
    return changed


def serve(cluster, name="glm-flash") -> None:
    def ready():
        ready_all_pods(cluster)
        return condition(cluster, "Ready", name) == ("True", "Serving")
    wait_for(ready, what=f"{name} Ready")


def metric(op, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.options.metrics_port}/metrics").read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.fixture
def custom(cluster):
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=cluster.kubeconfig_path, client_configuration=config)
    with kubernetes.client.ApiClient(config) as api:
        yield kubernetes.client.CustomObjectsApi(api)


def patch_spec(custom, spec: dict, name="glm-flash") -> None:
    custom.patch_namespaced_custom_object("pd.serving.dev", "v1alpha1", NS, "pddeployments", name,
                                          {"spec": spec})


def test_glm_example_converges_to_ready_and_then_writes_nothing(cluster, start_operator):
    op = start_operator(drift_interval_s=1.0)
    cluster.create(example())
    wait_for(lambda: set(children(cluster)) == GLM_CHILDREN, what="all children")
    found = children(cluster)
    uid = pdd(cluster)["metadata"]["uid"]
    for obj in found.values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["controller"], ref["kind"]) == (uid, True, "PDDeployment")
    wait_for(lambda: condition(cluster, "KVCompatible") == ("True", "Compatible"), what="KVCompatible")
    assert condition(cluster, "Ready") == ("False", "InstancesNotReady")

    serve(cluster)
    status = pdd(cluster)["status"]
    assert status["prefill"]["shape"] == "1xTP8" and status["decode"]["shape"] == "1xDP2xTP4"
    assert status["kvLayout"]["prefillBlockSize"] == 640 and status["kvLayout"]["decodeBlockSize"] == 1152
    wait_for(lambda: metric(op, "pd_operator_pddeployment_ready{") == 1.0, what="Ready gauge")
    health = urllib.request.urlopen(f"http://127.0.0.1:{op.options.health_port}/healthz", timeout=5)
    assert health.status == 200

    wait_for(lambda: condition(cluster, "Progressing") == ("False", "Complete"), what="settled")
    writes, runs = cluster.requests.count_writes(), metric(op, "pd_operator_reconcile_total")
    wait_for(lambda: metric(op, "pd_operator_reconcile_total") >= runs + 2, what="two drift reconciles")
    assert cluster.requests.count_writes() == writes, [
        (r.method, r.path) for r in cluster.requests[-20:] if r.method != "GET"]
    reasons = [e["reason"] for e in cluster.list("v1", "Event", NS)]
    assert reasons.count("Serving") == 1 and reasons.count("Compatible") == 1

    # No finalizer: deletion needs no operator; the owner references take the children along.
    assert not pdd(cluster)["metadata"].get("finalizers")
    cluster.delete(API, "PDDeployment", NS, "glm-flash")
    wait_for(lambda: children(cluster) == {}, what="children collected with their owner")


def test_model_config_from_a_config_map(cluster, start_operator):
    start_operator(drift_interval_s=0.5)  # nothing of ours changes when the ConfigMap appears
    doc = example()
    doc["spec"]["model"].pop("preset")
    doc["spec"]["model"]["hfConfigMap"] = {"name": "glm-config"}
    cluster.create(doc)
    wait_for(lambda: condition(cluster, "KVCompatible") == ("False", "ConfigMapNotFound"), what="missing")
    assert children(cluster) == {}
    config = (ROOT / "tests" / "kv" / "hf_configs" / "glm-5.3-flash" / "config.json").read_text()
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "glm-config", "namespace": NS}, "data": {"config.json": config}})
    wait_for(lambda: condition(cluster, "KVCompatible") == ("True", "Compatible"), what="read from the map")
    wait_for(lambda: set(children(cluster)) == GLM_CHILDREN, what="children")
    assert pdd(cluster)["status"]["kvLayout"]["decodeBlockSize"] == 1152


def test_incompatible_manifest_admitted_anyway_creates_nothing(cluster, start_operator):
    start_operator()
    cluster.create(example("incompatible-glm-tp8-tp3.yaml"))
    name = example("incompatible-glm-tp8-tp3.yaml")["metadata"]["name"]
    wait_for(lambda: condition(cluster, "KVCompatible", name) == ("False", "HeadsNotDivisibleByTP"),
             what="KVCompatible=False")
    assert children(cluster, name) == {}
    warning = wait_for(lambda: [e for e in cluster.list("v1", "Event", NS)
                                if e["reason"] == "HeadsNotDivisibleByTP"], what="event")
    assert warning[0]["type"] == "Warning" and "spec.decode.tensorParallelSize" in warning[0]["message"]


def test_invalid_update_keeps_children_and_a_fix_or_scale_down_applies(cluster, start_operator, custom):
    start_operator()
    doc = example()
    doc["spec"]["decode"]["replicas"] = 2
    cluster.create(doc)
    wait_for(lambda: "StatefulSet/glm-flash-decode-1" in children(cluster), what="children")
    serve(cluster)
    before = {k: v["metadata"]["resourceVersion"] for k, v in children(cluster).items()}

    patch_spec(custom, {"decode": {"tensorParallelSize": 3, "dataParallelSize": 1}})
    wait_for(lambda: condition(cluster, "KVCompatible") == ("False", "HeadsNotDivisibleByTP"), what="invalid")
    assert {k: v["metadata"]["resourceVersion"] for k, v in children(cluster).items()} == before
    assert pdd(cluster)["status"]["kvLayout"]["decodeBlockSize"] == 1152  # the running layout

    patch_spec(custom, {"decode": {"tensorParallelSize": 4, "dataParallelSize": 2, "replicas": 1}})
    wait_for(lambda: "StatefulSet/glm-flash-decode-1" not in children(cluster), what="prune")
    assert "Service/glm-flash-decode-1" not in children(cluster)
    serve(cluster)


def test_deleted_child_is_restored_and_foreign_one_left_alone(cluster, start_operator):
    start_operator(namespaces=["default"])  # --namespace default: "other" is not served
    elsewhere = example()
    elsewhere["metadata"]["namespace"] = "other"
    cluster.create(elsewhere)
    cluster.create(example())
    wait_for(lambda: set(children(cluster)) == GLM_CHILDREN, what="children")
    assert cluster.list("apps/v1", "StatefulSet", "other") == []
    old = children(cluster)["Service/glm-flash-decode-0"]["metadata"]["uid"]
    cluster.delete("v1", "Service", NS, "glm-flash-decode-0")
    wait_for(lambda: (children(cluster).get("Service/glm-flash-decode-0") or {"metadata": {"uid": old}})
             ["metadata"]["uid"] != old, what="service restored")

    foreign = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "hand-made", "namespace": NS,
                            "labels": {"pd.serving.dev/deployment": "glm-flash"}}, "data": {}}
    cluster.create(foreign)
    wait_for(lambda: condition(cluster, "Degraded") == ("True", "ForeignChild"), what="ForeignChild")
    assert cluster.get("v1", "ConfigMap", NS, "hand-made") is not None


def test_failed_rank_restarts_its_whole_group(cluster, start_operator):
    start_operator()
    doc = example()
    doc["spec"]["decode"]["npusPerNode"] = 4  # DP2 x TP4 on 4-NPU nodes: two pods per decode instance
    cluster.create(doc)
    wait_for(lambda: len(cluster.list("v1", "Pod", NS, "pd.serving.dev/role=decode")) == 2, what="pods")
    serve(cluster)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"]
            for p in cluster.list("v1", "Pod", NS, "pd.serving.dev/role=decode")}
    prefill_uid = cluster.get("v1", "Pod", NS, "glm-flash-prefill-0-0")["metadata"]["uid"]

    cluster.fail_pod(NS, "glm-flash-decode-0-1")

    def recreated():
        pods = cluster.list("v1", "Pod", NS, "pd.serving.dev/role=decode")
        return len(pods) == 2 and all(p["metadata"]["uid"] != uids[p["metadata"]["name"]] for p in pods)
    wait_for(recreated, what="both decode pods recreated")
    assert cluster.get("v1", "Pod", NS, "glm-flash-prefill-0-0")["metadata"]["uid"] == prefill_uid
    sts = cluster.get("apps/v1", "StatefulSet", NS, "glm-flash-decode-0")
    assert len(sts["metadata"]["annotations"][HISTORY].split(",")) == 1
    events = wait_for(lambda: [e for e in cluster.list("v1", "Event", NS) if e["reason"] == "GroupRestart"],
                      what="the GroupRestart event")
    assert len(events) == 1 and "glm-flash-decode-0-1" in events[0]["message"], [
        (e["message"], e["metadata"].get("creationTimestamp")) for e in events]
    serve(cluster)


def test_operator_killed_mid_reconcile_converges_without_duplicates(cluster, start_operator, tmp_path):
    # `python -m pd_operator run` in its own process, SIGKILLed between two applies (they are slowed
    # down), then a fresh operator takes over.
    cluster.faults.configure(rate=1.0, kinds=["slow"], verbs=["patch"], delay_s=0.3)
    log = (tmp_path / "operator.log").open("w")
    first = subprocess.Popen(
        [sys.executable, "-m", "pd_operator", "run", "--kubeconfig", cluster.kubeconfig_path, "--no-webhook",
         f"--health-port={free_port()}", f"--metrics-port={free_port()}", "--log-format=json"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        cluster.create(example())
        wait_for(lambda: 1 <= len(children(cluster)) < len(GLM_CHILDREN), timeout=30, what="a partial apply")
    finally:
        first.kill()
        first.wait(timeout=10)
    partial = set(children(cluster))
    assert partial < GLM_CHILDREN, "the kill came too late to interrupt the reconcile"
    cluster.faults.off()

    start_operator()
    wait_for(lambda: set(children(cluster)) == GLM_CHILDREN, what="all children after restart")
    serve(cluster)
    for obj in children(cluster).values():
        assert len(obj["metadata"]["ownerReferences"]) == 1
    pods = cluster.list("v1", "Pod", NS)
    assert len(pods) == len({p["metadata"]["name"] for p in pods}) == 3
    lines = [json.loads(line) for line in (tmp_path / "operator.log").read_text().splitlines()
             if line.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)


def test_webhook_over_https_rejects_incompatible_and_warns(cluster, start_operator):
    op = start_operator(webhook=True, webhook_self_signed=True, webhook_port=free_port())
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE

    def review(obj: dict, operation: str) -> dict:
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "r-1", "operation": operation, "object": obj,
                            "oldObject": copy.deepcopy(obj) if operation == "UPDATE" else None,
                            "kind": {"group": "pd.serving.dev", "version": "v1alpha1",
                                     "kind": "PDDeployment"},
                            "resource": {"group": "pd.serving.dev", "version": "v1alpha1",
                                         "resource": "pddeployments"},
                            "namespace": NS, "name": obj["metadata"]["name"], "userInfo": {},
                            "dryRun": False}}
        request = urllib.request.Request(
            f"https://127.0.0.1:{op.options.webhook_port}/validate-pddeployment", method="POST",
            data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(request, context=context, timeout=10).read())["response"]

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", op.options.webhook_port), timeout=1).close()
            return True
        except OSError:
            return False
    wait_for(listening, what="the webhook server")
    bad = review(example("incompatible-glm-tp8-tp3.yaml"), "UPDATE")
    assert bad["allowed"] is False
    assert bad["status"]["message"].startswith("spec.decode.tensorParallelSize: ")
    assert "keeps serving" in bad["status"]["message"]
    good = review(example(), "CREATE")
    assert good["allowed"] is True and any("spec.decode.blockSize" in w for w in good.get("warnings", []))


def test_kv_layout_rollout_never_routes_across_layouts(cluster, start_operator, custom):
    start_operator()
    cluster.create(example())
    wait_for(lambda: set(children(cluster)) == GLM_CHILDREN, what="children")
    serve(cluster)
    old_layout = pdd(cluster)["status"]["kvLayout"]["hash"]
    # Slow StatefulSet, Deployment and status patches widen the window in which the two roles run
    # different layouts and the proxy stays gated (each status the operator writes stays at least
    # 0.5 s before the next lands), so the 50 ms poll below sees it.
    cluster.faults.configure(rate=1.0, kinds=["slow"], verbs=["patch"],
                             resources=["statefulsets", "deployments", "pddeployments"], delay_s=0.5)
    rebuilt = "registry.example.com/pd-operator/pd-vllm-ascend:v0.30.0rc2-seed-b"
    patch_spec(custom, {"image": {"name": rebuilt}})

    def proxy_gated() -> bool:
        status = pdd(cluster).get("status") or {}
        proxy = cluster.get("apps/v1", "Deployment", NS, "glm-flash-proxy")
        return (condition(cluster, "Progressing") == ("True", "RollingOut")
                and status["kvLayout"]["hash"] != old_layout and proxy["spec"]["replicas"] == 0)
    wait_for(proxy_gated, what="RollingOut with the proxy scaled to zero")
    cluster.faults.off()
    serve(cluster)
    assert cluster.get("apps/v1", "Deployment", NS, "glm-flash-proxy")["spec"]["replicas"] == 1
    new_layout = pdd(cluster)["status"]["kvLayout"]["hash"]
    assert {p["metadata"]["labels"]["pd.serving.dev/kv-layout"]
            for p in cluster.list("v1", "Pod", NS, "pd.serving.dev/role in (prefill,decode)")} == {new_layout}


def test_a_broken_kv_link_takes_the_decode_instance_out_of_the_proxy(cluster, start_operator):
    start_operator()
    cluster.create(example())
    wait_for(lambda: set(children(cluster)) == GLM_CHILDREN, what="children")
    serve(cluster)
    assert pdd(cluster)["status"]["kvLinks"] == [
        {"decode": "glm-flash-decode-0", "prefill": "glm-flash-prefill-0", "linked": True}]
    # The decode pod's kv-link gate fails (the kubelet marks that container, and so the pod, not ready).
    cluster.set_pod_ready(NS, "glm-flash-decode-0-0", False, container="kv-link")

    def routed_around() -> bool:
        proxy = cluster.get("apps/v1", "Deployment", NS, "glm-flash-proxy")
        return (condition(cluster, "DecodeReady") == ("False", "KVLinkNotReady")
                and proxy["spec"]["replicas"] == 0)
    wait_for(routed_around, what="DecodeReady KVLinkNotReady with the proxy scaled to zero")
    assert condition(cluster, "Ready") == ("False", "KVLinkNotReady")
    assert [e["linked"] for e in pdd(cluster)["status"]["kvLinks"]] == [False]
    cluster.set_pod_ready(NS, "glm-flash-decode-0-0", True, container="kv-link")
    serve(cluster)  # the proxy is scaled up again; its new pod becomes ready
    assert cluster.get("apps/v1", "Deployment", NS, "glm-flash-proxy")["spec"]["replicas"] == 1

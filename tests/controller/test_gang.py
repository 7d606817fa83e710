"""Gang scheduling and placement by network domain with the real kube-scheduler (issue 18 items 6, 7).

One control plane for the module, with kube-scheduler's gang scheduling on (ControlPlane(
gang_scheduling=True): the GenericWorkload, GangScheduling and TopologyAwareWorkloadScheduling
gates, scheduling.k8s.io/v1alpha2 served) and kwok nodes of 8 NPUs in three network domains of
2, 3 and 1 nodes. Volcano's PodGroups are checked against Volcano's published CRD installed into the
same API server; no Volcano scheduler runs here, so nothing is scheduled by Volcano."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator

import jsonschema
import pytest
import yaml

from pd_operator.api.labels import INSTANCE, ROLE, VOLCANO_GROUP
from pd_operator.controller.diff import holds
from pd_operator.render import render
from support.cluster import ApiError, ControlPlane, NodePool, wait_for
from support.installed import condition, get_pdd
from support.pdd_cluster import apply, children, cond, glm, listed, pods, serve, wait_cond
from support.rollout import IN_PLACE, progressing
from support.rollout import status as rollout_status
from support.specs import resolve
from support.volcano import podgroup_crd

pytestmark = [pytest.mark.integration, pytest.mark.scaling]

DOMAIN = "network.example.com/super-pod"
NPU = "huawei.com/Ascend910"
NODES = (NodePool("sp-a", 2, NPU, 8, {DOMAIN: "sp-a"}),
         NodePool("sp-b", 3, NPU, 8, {DOMAIN: "sp-b"}),
         NodePool("sp-c", 1, NPU, 8, {DOMAIN: "sp-c"}))
KUBE_PODGROUPS = "scheduling.k8s.io/v1alpha2"
VOLCANO_PODGROUPS = "scheduling.volcano.sh/v1beta1"


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """This module's own control plane (it shadows the session's for every fixture here)."""
    cp = ControlPlane(nodes=NODES, gang_scheduling=True).start()
    yield cp
    cp.stop(keep=bool(os.environ.get("PD_KEEP_CLUSTER")) or request.session.testsfailed > 0)


def _domains(cp: ControlPlane) -> dict[str, str]:
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(DOMAIN, "")
            for n in cp.api("GET", "/api/v1/nodes")["items"]}


def _instances(cp: ControlPlane, namespace: str, role: str, name: str) -> dict[str, list[str]]:
    """instance index -> the nodes of its pods ("" for a pod not bound)."""
    out: dict[str, list[str]] = {}
    for pod in pods(cp, namespace, f"pd.serving.dev/deployment={name},{ROLE}={role}"):
        out.setdefault(pod["metadata"]["labels"][INSTANCE], []).append(pod["spec"].get("nodeName", ""))
    return out


def _doc(namespace: str, name: str = "glm-flash", **decode) -> dict:
    """GLM with its prefill pinned to domain sp-c and decode instances of several pods."""
    doc = glm(namespace)
    doc["metadata"]["name"] = name
    doc["spec"]["prefill"]["nodeSelector"] = {DOMAIN: "sp-c"}
    doc["spec"]["decode"].update(decode)
    return doc


def test_the_pods_of_an_instance_share_a_domain(control_plane, namespace, start_operator, release):
    cp = control_plane
    op = start_operator("--drift-interval=2")
    # Two decode instances of 2 pods (DP4 x TP4): only sp-a (2 nodes) and sp-b (3) can hold one each.
    doc = _doc(namespace, replicas=2, dataParallelSize=4)
    doc["spec"]["scheduling"] = {"gang": "kubernetes"}
    doc["spec"]["placement"] = {"domainLabel": DOMAIN, "gangTopology": True}
    apply(cp, doc)
    serve(cp, namespace)

    where = _domains(cp)
    decode = _instances(cp, namespace, "decode", "glm-flash")
    assert sorted(decode) == ["0", "1"]
    for index, nodes in decode.items():
        assert len(set(nodes)) == 2, (index, nodes)             # a node per pod
        assert len({where[n] for n in nodes}) == 1, (index, {n: where[n] for n in nodes})
    assert {where[nodes[0]] for nodes in decode.values()} == {"sp-a", "sp-b"}
    assert [where[n] for nodes in _instances(cp, namespace, "prefill", "glm-flash").values()
            for n in nodes] == ["sp-c"]

    assert cond(cp, namespace, "GangScheduling") == ("True", "PodGroups")
    groups = listed(cp, KUBE_PODGROUPS, "podgroups", namespace)
    assert sorted(g["spec"]["schedulingPolicy"]["gang"]["minCount"] for g in groups) == [1, 2, 2]
    assert all(g["spec"]["schedulingConstraints"] == {"topology": [{"key": DOMAIN}]} for g in groups)
    scheduled = [c for g in groups for c in (g.get("status") or {}).get("conditions", [])
                 if c["type"] == "PodGroupScheduled"]
    assert scheduled and all(c["status"] == "True" for c in scheduled), scheduled
    # What the API server adds (disruptionMode, status) is not drift: no PodGroup is applied again.
    assert op.writes_when_settled(cp, release.user, namespace, "podgroups") == []


def test_a_new_pod_count_under_the_gang_replaces_the_instance_whole(control_plane, namespace, start_operator):
    """kube-scheduler's PodGroup is immutable, so a new pod count is a new PodGroup; a rolling update
    one pod at a time would leave the first new pod waiting for a group that never fills."""
    cp = control_plane
    start_operator()
    doc = _doc(namespace, dataParallelSize=4)  # one decode instance of 2 pods
    doc["spec"]["scheduling"] = {"gang": "kubernetes"}
    doc["spec"]["placement"] = {"domainLabel": DOMAIN, "gangTopology": True}
    apply(cp, doc)
    serve(cp, namespace)
    assert _bound(cp, namespace, "glm-flash") == [True, True]

    # 3 pods: only sp-b holds them, so no surge instance fits beside the old one: replaced in place.
    # The old decode instance serves whole on its own 2 pods meanwhile, so it leaves only with the
    # prefill instance (no step takes the serving ratio out of bounds), which moves in place too (the
    # pairing changed: a new prefill revision).
    doc["spec"]["decode"]["dataParallelSize"] = 6
    doc["spec"]["decode"]["rollout"] = IN_PLACE
    doc["spec"]["prefill"]["rollout"] = IN_PLACE
    apply(cp, doc)

    def whole_on_the_new_group() -> bool:
        decode = pods(cp, namespace, f"pd.serving.dev/deployment=glm-flash,{ROLE}=decode")
        groups = {(p["spec"].get("schedulingGroup") or {}).get("podGroupName") for p in decode}
        return len(decode) == 3 and len(groups) == 1 and all(p["spec"].get("nodeName") for p in decode)
    wait_for("3 decode pods of one PodGroup, all bound", whole_on_the_new_group)
    wait_cond(cp, namespace, "DecodeReady", ("True", "InstancesReady"))
    where = _domains(cp)
    assert {where[n] for n in _instances(cp, namespace, "decode", "glm-flash")["0"]} == {"sp-b"}
    def min_counts() -> list[int]:
        groups = listed(cp, KUBE_PODGROUPS, "podgroups", namespace, f"{ROLE}=decode")
        return [g["spec"]["schedulingPolicy"]["gang"]["minCount"] for g in groups
                if not g["metadata"].get("deletionTimestamp")]
    wait_for("the old PodGroup pruned", lambda: min_counts() == [3])



def test_mid_rollout_a_pod_of_an_instance_not_moved_finds_its_own_podgroup(control_plane, namespace,
                                                                           start_operator):
    """Issue 32: decode one pod per instance -> two (npusPerNode 8 -> 4), held by a pause. The
    instances not moved yet keep their own PodGroups (minCount 1, the names their pods carry); none
    of the spec's new shape is created ahead of them; a pod of one evicted comes back and is bound.
    With the spec's groups instead, its group would be pruned and the new pod wait for it unbound."""
    cp = control_plane
    start_operator("--drift-interval=2")
    doc = _doc(namespace, replicas=2)  # decode DP2 x TP4 on nodes of 8: one pod per instance
    doc["spec"]["scheduling"] = {"gang": "kubernetes"}
    apply(cp, doc)
    serve(cp, namespace)
    decode = f"pd.serving.dev/deployment=glm-flash,{ROLE}=decode"
    before = {p["metadata"]["name"]: p["spec"]["schedulingGroup"]["podGroupName"]
              for p in pods(cp, namespace, decode)}
    assert sorted(before) == ["glm-flash-decode-0-0", "glm-flash-decode-1-0"]

    old = rollout_status(cp, namespace)["decode"]["revision"]
    doc["spec"]["decode"]["npusPerNode"] = 4
    for role in ("prefill", "decode"):
        doc["spec"][role]["rollout"] = {"paused": True}
    apply(cp, doc)
    def paused() -> bool:
        st = rollout_status(cp, namespace)
        return progressing(st) == ("Unknown", "RolloutPaused") and st["decode"]["revision"] != old
    wait_for("the paused rollout", paused)

    def groups() -> dict[str, int]:
        return {g["metadata"]["name"]: g["spec"]["schedulingPolicy"]["gang"]["minCount"]
                for g in listed(cp, KUBE_PODGROUPS, "podgroups", namespace, f"{ROLE}=decode")
                if not g["metadata"].get("deletionTimestamp")}
    assert groups() == {name: 1 for name in before.values()}

    evicted = "glm-flash-decode-0-0"
    uid = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods/{evicted}")["metadata"]["uid"]
    cp.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{evicted}")

    def back() -> dict | None:
        found = cp.find(f"/api/v1/namespaces/{namespace}/pods/{evicted}")
        ok = found is not None and found["metadata"]["uid"] != uid and found["spec"].get("nodeName")
        return found if ok else None
    pod = wait_for(f"{evicted} recreated and bound", back)
    assert pod["spec"]["schedulingGroup"]["podGroupName"] == before[evicted]
    assert groups() == {name: 1 for name in before.values()}

def _bound(cp: ControlPlane, namespace: str, name: str) -> list[bool]:
    instances = _instances(cp, namespace, "decode", name)
    return sorted(bool(node) for nodes in instances.values() for node in nodes)


def test_an_instance_that_cannot_be_placed_whole_binds_no_pod(control_plane, namespace, start_operator):
    cp = control_plane
    start_operator()
    # One decode instance of 3 pods (DP6 x TP4) held to sp-a, which has 2 nodes.
    decode = {"dataParallelSize": 6, "nodeSelector": {DOMAIN: "sp-a"}}

    # Without gang scheduling the scheduler binds what fits, and the status warns it can.
    apply(cp, _doc(namespace, "glm-none", **decode))
    wait_for("2 of 3 decode pods bound", lambda: _bound(cp, namespace, "glm-none") == [False, True, True])
    wait_cond(cp, namespace, "DecodeReady", ("False", "Unschedulable"), "glm-none")
    assert cond(cp, namespace, "GangScheduling", "glm-none") == ("False", "PartialPlacementPossible")
    cp.api("DELETE", f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/pddeployments/glm-none")
    wait_for("glm-none's pods gone", lambda: not pods(cp, namespace, "pd.serving.dev/deployment=glm-none"))

    # With kube-scheduler's gang the whole group is tried and none of it binds.
    doc = _doc(namespace, "glm-gang", **decode)
    doc["spec"]["scheduling"] = {"gang": "kubernetes"}
    apply(cp, doc)
    wait_cond(cp, namespace, "DecodeReady", ("False", "Unschedulable"), "glm-gang")

    def group_unschedulable() -> bool:
        groups = listed(cp, KUBE_PODGROUPS, "podgroups", namespace, f"{ROLE}=decode")
        return any(c["type"] == "PodGroupScheduled" and c["status"] == "False"
                   for g in groups for c in (g.get("status") or {}).get("conditions", []))
    wait_for("the decode PodGroup found unschedulable", group_unschedulable)
    assert _bound(cp, namespace, "glm-gang") == [False, False, False]
    assert cond(cp, namespace, "GangScheduling", "glm-gang") == ("True", "PodGroups")

    # A third node in sp-a: the scheduler now binds all three together.
    extra = NodePool("sp-a-extra", 1, NPU, 8, {DOMAIN: "sp-a"}).nodes()[0]
    cp.api("POST", "/api/v1/nodes", extra)
    try:
        wait_cond(cp, namespace, "DecodeReady", ("True", "InstancesReady"), "glm-gang")
        assert _bound(cp, namespace, "glm-gang") == [True, True, True]
    finally:
        with contextlib.suppress(ApiError):
            cp.api("DELETE", f"/api/v1/nodes/{extra['metadata']['name']}")


def _install_volcano_crd(cp: ControlPlane) -> dict:
    crd = yaml.safe_load(podgroup_crd().read_text())
    cp.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def established() -> bool:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
        got = cp.api("GET", path)
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (got.get("status") or {}).get("conditions") or [])
    wait_for("Volcano's PodGroup CRD established", established)
    return dict(crd)


def _unknown_fields(obj: object, schema: dict, path: str = "") -> list[str]:
    """Fields of `obj` the structural schema does not declare (the API server would prune them)."""
    if isinstance(obj, dict) and "properties" in schema:
        out = []
        for key, value in obj.items():
            if key not in schema["properties"]:
                out.append(f"{path}.{key}")
            else:
                out += _unknown_fields(value, schema["properties"][key], f"{path}.{key}")
        return out
    return []


def test_volcano_podgroups_follow_volcanos_published_crd(control_plane, namespace, start_operator, release):
    cp = control_plane
    op = start_operator("--drift-interval=2")
    doc = _doc(namespace, dataParallelSize=4)
    doc["spec"]["scheduling"] = {"gang": "volcano", "queue": "inference", "priorityClassName": "serving"}
    doc["spec"]["placement"] = {"domainLabel": DOMAIN}
    apply(cp, doc)

    # No Volcano yet: a clear status, no StatefulSet, the operator keeps running.
    wait_cond(cp, namespace, "GangScheduling", ("False", "GangUnavailable"))
    assert cond(cp, namespace, "Ready") == ("False", "GangUnavailable")
    message = condition(get_pdd(cp, namespace, "glm-flash"), "GangScheduling")["message"]
    assert "podgroups.scheduling.volcano.sh" in message, message
    assert not [ref for ref in children(cp, namespace) if ref.startswith("StatefulSet/")]

    crd = _install_volcano_crd(cp)
    wait_cond(cp, namespace, "GangScheduling", ("True", "PodGroups"))
    rendered = [m for m in render(resolve(doc)) if m["kind"] == "PodGroup"]
    assert sorted(m["metadata"]["name"] for m in rendered) == ["glm-flash-decode-0", "glm-flash-prefill-0"]
    stored = {g["metadata"]["name"]: g for g in listed(cp, VOLCANO_PODGROUPS, "podgroups", namespace)}
    for manifest in rendered:  # what the operator applied is stored whole: nothing pruned by the schema
        assert holds(stored[manifest["metadata"]["name"]], manifest), stored[manifest["metadata"]["name"]]
    wait_for("the decode StatefulSet", lambda: "StatefulSet/glm-flash-decode-0" in children(cp, namespace))
    template = children(cp, namespace)["StatefulSet/glm-flash-decode-0"]["spec"]["template"]
    assert template["metadata"]["annotations"][VOLCANO_GROUP] == "glm-flash-decode-0"
    assert template["spec"]["schedulerName"] == "volcano"
    assert op.running() and "Traceback" not in op.output()
    assert op.writes_when_settled(cp, release.user, namespace, "podgroups") == []

    # Server-side, strictly: every rendered PodGroup is created as is; a misspelt or mistyped field is not.
    base = f"/apis/{VOLCANO_PODGROUPS}/namespaces/{namespace}/podgroups?fieldValidation=Strict"
    for manifest in rendered:
        copy_ = copy.deepcopy(manifest)
        copy_["metadata"] = {"name": f"{manifest['metadata']['name']}-strict"}
        cp.api("POST", base, copy_)
    for bad_spec in ({"minMembers": 2}, {"minMember": "two"}):
        with pytest.raises(ApiError) as refused:
            cp.api("POST", base, {"apiVersion": VOLCANO_PODGROUPS, "kind": "PodGroup",
                                  "metadata": {"name": "bad"}, "spec": bad_spec})
        assert refused.value.status in (400, 422), refused.value

    # Offline, against the same schema (jsonschema for types and patterns, plus undeclared fields).
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    schema = version["schema"]["openAPIV3Schema"]
    for manifest in rendered:
        jsonschema.validate(manifest, schema)
        assert not _unknown_fields(manifest, schema)
    assert _unknown_fields({"spec": {"minMembers": 2}}, schema) == [".spec.minMembers"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"spec": {"minMember": "two"}}, schema)


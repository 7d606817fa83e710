"""Each instance on its own revision until the rollout moves it (issue 32 item 1), on the real control
plane: kube-apiserver, the StatefulSet controller (OnDelete) and kwok running the pods, the operator
as the chart runs it. During a paused rollout a pod evicted from an instance not moved yet comes back
on the instance's own (old) template, and a StatefulSet deleted comes back on its own revision from
its record (a ControllerRevision), also when it was deleted while the operator was down; resumed, the
rollout moves every instance and records the new revision as each one's newest."""

from __future__ import annotations

import pytest

from pd_operator.api.labels import RECORDED_REVISION, REVISION
from pd_operator.api.types import ROLES
from support.cluster import ControlPlane, wait_for
from support.fleet import records
from support.kube import kubectl
from support.pdd_cluster import READY_TIMEOUT_S, apply, pods, serve
from support.rollout import GLM, IN_PLACE, NEW_IMAGE, progressing, rolled, status, two_by_two

pytestmark = [pytest.mark.integration, pytest.mark.rollout]


def _sts(cp: ControlPlane, namespace: str, name: str) -> dict | None:
    return cp.find(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}")


def _template_revision(sts: dict | None) -> str | None:
    return sts["spec"]["template"]["metadata"]["labels"][REVISION] if sts else None


def _pod_revision(cp: ControlPlane, namespace: str, name: str, not_uid: str = "") -> str | None:
    """The revision of pod `name` once it exists (with another uid than `not_uid`)."""
    found = cp.find(f"/api/v1/namespaces/{namespace}/pods/{name}")
    if found is None or found["metadata"]["uid"] == not_uid or found["metadata"].get("deletionTimestamp"):
        return None
    return str(found["metadata"]["labels"][REVISION])


def _restored(cp: ControlPlane, namespace: str, name: str, uid: str, revision: str) -> None:
    """Wait until StatefulSet `name` exists again (not `uid`) and its pod runs `revision`."""
    def back() -> bool:
        sts = _sts(cp, namespace, name)
        return sts is not None and sts["metadata"]["uid"] != uid and _template_revision(sts) == revision \
            and _pod_revision(cp, namespace, f"{name}-0") == revision
    wait_for(f"{name} restored on revision {revision}", back, READY_TIMEOUT_S)


def test_instances_not_moved_keep_their_revision_through_evictions_deletes_and_restarts(
        control_plane, namespace, start_operator):
    cp = control_plane
    operator = start_operator()
    doc = two_by_two(namespace)
    for role in ROLES:
        doc["spec"][role]["rollout"] = dict(IN_PLACE)
    apply(cp, doc)
    serve(cp, namespace)
    old = {role: status(cp, namespace)[role]["revision"] for role in ROLES}

    doc["spec"]["image"]["name"] = NEW_IMAGE
    for role in ROLES:
        doc["spec"][role]["rollout"]["paused"] = True
    apply(cp, doc)
    wait_for("the paused rollout", lambda: progressing(status(cp, namespace)) == ("Unknown", "RolloutPaused")
             and all(status(cp, namespace)[r]["revision"] != old[r] for r in ROLES), READY_TIMEOUT_S)
    for role in ROLES:  # no instance's StatefulSet has the new template
        for i in (0, 1):
            assert _template_revision(_sts(cp, namespace, f"{GLM}-{role}-{i}")) == old[role]

    # An evicted pod comes back from its StatefulSet's template: the old one.
    evicted = f"{GLM}-decode-0-0"
    uid = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods/{evicted}")["metadata"]["uid"]
    cp.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{evicted}")
    back = wait_for(f"{evicted} recreated", lambda: _pod_revision(cp, namespace, evicted, uid),
                    READY_TIMEOUT_S)
    assert back == old["decode"]

    # A deleted StatefulSet comes back from its record, on its own revision.
    name = f"{GLM}-decode-1"
    uid = _sts(cp, namespace, name)["metadata"]["uid"]  # type: ignore[index]
    kubectl(cp.kubeconfig, "delete", "statefulset", name, "-n", namespace)
    _restored(cp, namespace, name, uid, old["decode"])

    # Deleted while the operator is down: its successor finds the revision in the cluster.
    operator.stop(timeout=30)
    name = f"{GLM}-prefill-1"
    uid = _sts(cp, namespace, name)["metadata"]["uid"]  # type: ignore[index]
    kubectl(cp.kubeconfig, "delete", "statefulset", name, "-n", namespace)
    wait_for(f"{name} gone", lambda: _sts(cp, namespace, name) is None, READY_TIMEOUT_S)
    start_operator()
    _restored(cp, namespace, name, uid, old["prefill"])

    for role in ROLES:
        doc["spec"][role]["rollout"]["paused"] = False
    apply(cp, doc)
    wait_for("the rollout complete", lambda: rolled(old)(status(cp, namespace)), READY_TIMEOUT_S)
    new = {role: status(cp, namespace)[role]["revision"] for role in ROLES}
    assert {p["metadata"]["labels"][REVISION] for p in pods(cp, namespace, "pd.serving.dev/role=decode")} \
        == {new["decode"]}
    found = records(cp, namespace, GLM)
    for role in ROLES:
        for i in (0, 1):
            prefix = f"{GLM}-{role}-{i}-rev-"
            mine = sorted((r for n, r in found.items() if n.startswith(prefix)), key=lambda r: r["revision"])
            # Each instance's newest record is of the new revision; the old one is kept as history.
            assert [r["metadata"]["labels"][RECORDED_REVISION] for r in mine][-1] == new[role], mine
            assert old[role] in {r["metadata"]["labels"][RECORDED_REVISION] for r in mine}


def test_a_change_of_pods_per_instance_moves_instance_by_instance(control_plane, namespace, start_operator):
    """Decode DP2 x TP4 on 8-NPU nodes (one pod) -> on 4-NPU nodes (two pods), held by a pause: the
    decode instances keep their one-pod StatefulSets and stay Ready (whole as their revision has
    them); resumed, each moves to two pods through the rollout."""
    cp = control_plane
    start_operator()
    doc = two_by_two(namespace)
    apply(cp, doc)
    serve(cp, namespace)
    old = {role: status(cp, namespace)[role]["revision"] for role in ROLES}
    doc["spec"]["decode"]["npusPerNode"] = 4
    for role in ROLES:
        doc["spec"][role].setdefault("rollout", {})["paused"] = True
    apply(cp, doc)
    wait_for("the paused rollout", lambda: progressing(status(cp, namespace)) == ("Unknown", "RolloutPaused")
             and status(cp, namespace)["decode"]["revision"] != old["decode"], READY_TIMEOUT_S)
    paused = status(cp, namespace)
    assert paused["decode"]["readyInstances"] == 2, paused["decode"]
    for i in (0, 1):
        assert _sts(cp, namespace, f"{GLM}-decode-{i}")["spec"]["replicas"] == 1  # type: ignore[index]
    serve(cp, namespace)

    for role in ROLES:
        doc["spec"][role]["rollout"]["paused"] = False
    apply(cp, doc)
    def moved(st: dict) -> bool:
        return (st["decode"]["updatedInstances"] == 2 and st["decode"]["revision"] != old["decode"]
                and progressing(st) == ("False", "Complete"))
    wait_for("the decode instances moved", lambda: moved(status(cp, namespace)), READY_TIMEOUT_S)
    for i in (0, 1):
        assert _sts(cp, namespace, f"{GLM}-decode-{i}")["spec"]["replicas"] == 2  # type: ignore[index]
    assert len(pods(cp, namespace, "pd.serving.dev/role=decode")) == 4

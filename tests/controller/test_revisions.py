"""Revisions as objects (issue 32): what a revision's pods read lives in immutable ConfigMaps named by
it, which its pod template names, kept while a pod or StatefulSet of it remains. Pure: the render,
and the real reconcile with an in-memory API client."""

from __future__ import annotations

import copy
import json

import pytest

from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.controller import revisions
from pd_operator.controller.client import NotServed
from pd_operator.controller.proxy_state import ProxyStateReader
from pd_operator.render import render, workloads
from support.controller_fakes import (
    RECONCILED_UID,
    MemoryClient,
    pods_with_volumes,
    reconciled_body,
    routed_names,
)
from support.renders import of_kind, serving_sets
from support.specs import example, resolve


def _configs(manifests: list[dict]) -> dict[str, dict]:
    """Per role: its revision config."""
    return {m["metadata"]["labels"]["pd.serving.dev/role"]: m for m in of_kind(manifests, "ConfigMap")
            if m.get("immutable")}


def _mounted(sts: dict) -> str:
    (name,) = [v["configMap"]["name"] for v in sts["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "pd-serving"]
    return name


def test_each_role_mounts_an_immutable_config_named_by_its_content():
    manifests = render(resolve(example()))
    configs = _configs(manifests)
    assert set(configs) == {"prefill", "decode"}
    for sts in serving_sets(manifests):
        role = sts["metadata"]["labels"]["pd.serving.dev/role"]
        assert _mounted(sts) == configs[role]["metadata"]["name"]
        assert configs[role]["metadata"]["name"].startswith(f"glm-flash-{role}-")
        assert f"preflight-{role}.json" in configs[role]["data"] and "pairing.json" in configs[role]["data"]
    # Nothing serving pods mount is edited in place: no mutable serving ConfigMap remains (the proxy's
    # membership is the proxy's, not a revision's).
    mutable = [m["metadata"]["name"] for m in of_kind(manifests, "ConfigMap") if not m.get("immutable")]
    assert mutable == ["glm-flash-proxy"]


def test_a_change_of_what_pods_read_is_a_new_config_and_revision_and_scaling_is_neither():
    doc = example()
    before = workloads.templates(resolve(doc))
    tp = copy.deepcopy(doc)
    tp["spec"]["decode"]["dataParallelSize"] = 4
    after = workloads.templates(resolve(tp))
    for role in ("prefill", "decode"):  # the pairing both probes read changed
        assert after.configs[role]["metadata"]["name"] != before.configs[role]["metadata"]["name"]
        assert after.revisions[role] != before.revisions[role]
    env = copy.deepcopy(doc)
    env["spec"]["decode"].setdefault("env", []).append({"name": "EXTRA", "value": "1"})
    changed = workloads.templates(resolve(env))
    assert changed.configs["decode"]["metadata"]["name"] == before.configs["decode"]["metadata"]["name"]
    assert changed.revisions["decode"] != before.revisions["decode"]
    for proxy in (True, False):  # the decode gates' peers are no part of a revision, with or without proxy
        base = copy.deepcopy(doc)
        base["spec"]["proxy"] = {"enabled": proxy}
        scaled = copy.deepcopy(base)
        scaled["spec"]["prefill"]["replicas"] = 3
        assert workloads.templates(resolve(scaled)).revisions == workloads.templates(resolve(base)).revisions


class PruningClient(MemoryClient):
    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []

    def get_child(self, manifest: dict) -> dict | None:
        return None

    def delete(self, obj: dict) -> None:
        self.deleted.append(f"{obj['kind']}/{obj['metadata']['name']}")

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete-pod", name))

    def annotate_stateful_set(self, namespace: str, name: str, annotations: dict) -> dict:
        raise AssertionError("no group restart here")


def _owned(objs: list[dict]) -> list[dict]:
    """As the API server returns what the reconcile applied (its owner reference to the PDDeployment
    is stamped on already)."""
    out = copy.deepcopy(objs)
    for o in out:
        assert o["metadata"]["ownerReferences"][0]["uid"] == RECONCILED_UID
    return out


def test_an_old_revision_config_stays_while_a_pod_mounts_it_and_goes_after():
    body = reconciled_body("glm-5.3-flash-1p1d-tp4.yaml")
    first = PruningClient()
    reconcile_mod.reconcile(first, ProxyStateReader(), body, [], [])  # type: ignore[arg-type]
    children = _owned([m for verb, m in first.writes if verb in ("apply", "create")])
    pods = pods_with_volumes(children)
    old = {m["metadata"]["name"] for m in children if m.get("immutable")}

    changed = copy.deepcopy(body)
    changed["spec"]["decode"]["tensorParallelSize"] = 2
    changed["metadata"]["generation"] = 2
    second = PruningClient()
    reconcile_mod.reconcile(second, ProxyStateReader(), changed, children, pods)  # type: ignore[arg-type]
    created = {m["metadata"]["name"] for verb, m in second.writes if verb == "apply" and m.get("immutable")}
    assert created and not created & old  # the new revision's configs are new objects
    assert not [d for d in second.deleted if d.split("/")[1] in old], second.deleted  # old pods mount them

    # The old instances keep their StatefulSets (and so their configs) until the rollout moves them.
    applied = {m["metadata"]["name"]: m for verb, m in second.writes if verb == "apply"}
    assert {n for n, m in applied.items() if m["kind"] == "StatefulSet"} == {
        f"glm-flash-1p1d-{role}-1" for role in ("prefill", "decode")}  # the surge instances only
    # Once no pod, StatefulSet or instance's record names the old configs (the old instances gone),
    # they are collected.
    now = _owned([c for c in children if c["kind"] not in ("StatefulSet", "ControllerRevision")]
                 + [m for n, m in applied.items() if n not in {c["metadata"]["name"] for c in children}])
    for sts in of_kind(now, "StatefulSet"):
        assert _mounted(sts) not in old
    third = PruningClient()
    reconcile_mod.reconcile(third, ProxyStateReader(), changed, now, [])  # type: ignore[arg-type]
    assert {d.split("/")[1] for d in third.deleted if d.startswith("ConfigMap/")} == old
    assert json.dumps(sorted(old))  # named, not empty


# -- each instance on its own revision (its record) until the rollout moves it --------------------------

IN_PLACE = {"maxUnavailable": 1, "maxSurge": 0}
DECODE = [f"glm-flash-1p1d-decode-{i}" for i in (0, 1)]


def _two_decodes(**rollout: object) -> dict:
    body = reconciled_body("glm-5.3-flash-1p1d-tp4.yaml")
    body["spec"]["decode"]["replicas"] = 2
    body["spec"]["decode"]["rollout"] = {**IN_PLACE, **rollout}
    return body


def _created(body: dict) -> list[dict]:
    first = MemoryClient()
    reconcile_mod.reconcile(first, ProxyStateReader(), body, [], [])  # type: ignore[arg-type]
    return _owned([m for verb, m in first.writes if verb in ("apply", "create")])


def _env_changed(body: dict, **rollout: object) -> dict:
    out = copy.deepcopy(body)
    out["spec"]["decode"].setdefault("env", []).append({"name": "EXTRA", "value": "1"})
    out["spec"]["decode"]["rollout"].update(rollout)
    out["metadata"]["generation"] = 2
    return out


def _stateful_sets(writes: list[tuple[str, object]]) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for verb, m in writes  # type: ignore[index]
            if verb == "apply" and m["kind"] == "StatefulSet"}  # type: ignore[index]


def _records(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["kind"] == "ControllerRevision"]


def _revision(sts: dict) -> str:
    return sts["spec"]["template"]["metadata"]["labels"]["pd.serving.dev/revision"]


def test_each_instance_is_recorded_with_its_whole_stateful_set_and_config():
    children = _created(_two_decodes())
    records = {r["metadata"]["name"]: r for r in _records(children)}
    assert len(records) == 3  # one per instance (1 prefill, 2 decode)
    sets = {s["metadata"]["name"]: s for s in of_kind(children, "StatefulSet")}
    for record in records.values():
        sts = sets[record["data"]["statefulSet"]["metadata"]["name"]]
        assert record["revision"] == 1
        assert record["metadata"]["name"].startswith(sts["metadata"]["name"] + "-rev-")
        assert record["data"]["statefulSet"]["spec"] == sts["spec"]  # replicas (pods per instance) too
        assert record["data"]["config"]["metadata"]["name"] == _mounted(sts)
        assert record["metadata"]["labels"]["pd.serving.dev/recorded-revision"] == _revision(sts)
        assert record["metadata"]["ownerReferences"][0]["uid"] == RECONCILED_UID


def test_a_paused_rollout_writes_no_instance_the_new_template():
    body = _two_decodes()
    children = _created(body)
    paused = MemoryClient()
    reconcile_mod.reconcile(paused, ProxyStateReader(), _env_changed(body, paused=True), children,  # type: ignore[arg-type]
                            pods_with_volumes(children))
    # Under OnDelete a pod evicted or crashed comes back from its StatefulSet's template: the template
    # stays the instance's own until the rollout moves it.
    assert _stateful_sets(paused.writes) == {}
    assert _records([m for verb, m in paused.writes if verb == "apply"]) == []  # type: ignore[misc]


def test_a_deleted_or_hand_edited_stateful_set_returns_on_its_own_revision():
    body = _two_decodes()
    children = _created(body)
    old = {s["metadata"]["name"]: s for s in of_kind(children, "StatefulSet")}
    edited = copy.deepcopy(old[DECODE[1]])
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "example.com/by-hand:1"
    observed = [edited if c is old[DECODE[1]] else c for c in children if c is not old[DECODE[0]]]
    client = MemoryClient()
    reconcile_mod.reconcile(client, ProxyStateReader(), _env_changed(body, paused=True), observed,  # type: ignore[arg-type]
                            pods_with_volumes(children))
    restored = _stateful_sets(client.writes)
    assert set(restored) == set(DECODE)
    for name in DECODE:  # the old template, not the spec's new one (the rollout is paused)
        assert restored[name]["spec"] == old[name]["spec"]
    # The configs they mount exist, and the records are not written again.
    assert _records([m for verb, m in client.writes if verb == "apply"]) == []  # type: ignore[misc]


def test_the_rollout_writes_the_new_template_to_the_instance_it_replaces_only():
    body = _two_decodes()
    children = _created(body)
    old = {s["metadata"]["name"]: s for s in of_kind(children, "StatefulSet")}
    client = PruningClient()
    reconcile_mod.reconcile(client, ProxyStateReader(), _env_changed(body), children,  # type: ignore[arg-type]
                            pods_with_volumes(children))
    # decode-1 moves first (highest ordinal); no proxy state to wait for, so its drain is done at once
    assert ("delete-pod", f"{DECODE[1]}-0") in client.writes
    written = _stateful_sets(client.writes)
    assert set(written) == {DECODE[1]}
    assert _revision(written[DECODE[1]]) != _revision(old[DECODE[1]])
    (record,) = _records([m for verb, m in client.writes if verb == "apply"])  # type: ignore[misc]
    assert record["revision"] == 2 and record["data"]["statefulSet"]["spec"] == written[DECODE[1]]["spec"]
    assert record["metadata"]["labels"]["pd.serving.dev/recorded-revision"] == _revision(written[DECODE[1]])
    assert not [d for d in client.deleted if d.startswith("ControllerRevision/")]  # history kept


def _history(count: int) -> tuple[list[dict], list[str]]:
    """`count` records of decode-0, numbered 1.., each of its own revision, owned."""
    body = _two_decodes()
    (sts,) = [s for s in of_kind(_created(body), "StatefulSet") if s["metadata"]["name"] == DECODE[0]]
    out = []
    for n in range(1, count + 1):
        variant = copy.deepcopy(sts)
        variant["spec"]["template"]["metadata"]["labels"]["pd.serving.dev/revision"] = f"rev{n}"
        rec = revisions.record(resolve(example("glm-5.3-flash-1p1d-tp4.yaml")).names, variant, {})
        rec["revision"] = n
        rec["metadata"]["ownerReferences"] = [{"uid": RECONCILED_UID, "controller": True}]
        out.append(rec)
    return out, [sts]


def _pod_on(revision: str) -> dict:
    labels = {"pd.serving.dev/role": "decode", "pd.serving.dev/instance": "0",
              "pd.serving.dev/revision": revision}
    return {"metadata": {"name": f"{DECODE[0]}-0", "labels": labels}}


def test_the_history_limit_bounds_the_records_of_revisions_no_pod_runs():
    records, desired = _history(13)
    names = [r["metadata"]["name"] for r in records]
    history = revisions.records(records, [], RECONCILED_UID)
    # The newest (the instance's revision) and one its pod still runs are kept beyond the limit.
    kept = revisions.kept_records(history, [_pod_on("rev1")], desired, {"decode": 10})
    assert kept == {names[0], *names[-11:]}
    kept = revisions.kept_records(history, [], desired, {"decode": 0})
    assert kept == {names[-1]}
    # An instance the spec no longer has keeps none (its StatefulSet goes too, once drained).
    assert revisions.kept_records(history, [_pod_on("rev13")], [], {"decode": 10}) == set()


def test_a_change_of_pods_per_instance_goes_through_the_rollout():
    """Decode TP4 -> TP4 x DP2 on 4-NPU nodes: one pod per instance -> two. The instances not moved
    yet keep their StatefulSet (and its `replicas`) and, with their one pod Ready, keep serving; the
    instance the rollout replaces gets both."""
    _children, client, _changed = _pods_per_instance_change("none")
    written = {n: s for n, s in _stateful_sets(client.writes).items() if "-decode-" in n}
    assert set(written) == {DECODE[1]} and written[DECODE[1]]["spec"]["replicas"] == 2
    assert ("delete-pod", f"{DECODE[1]}-0") in client.writes
    (status,) = [s for verb, s in client.writes if verb == "status"]
    (kept,) = [i for i in status["decode"]["instances"] if i["name"] == DECODE[0]]
    assert kept["ready"], status["decode"]  # its one pod is all its revision runs
    applied = [m for verb, m in client.writes if verb == "apply"]
    if any(m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-proxy") for m in applied):
        assert routed_names(applied, "decode") == [DECODE[0]]


# -- each instance's PodGroup is its revision's (spec.scheduling.gang) ----------------------------------

VOLCANO_GROUP = "scheduling.k8s.io/group-name"


def _group_named(sts: dict) -> str:
    """The PodGroup the pods of `sts` name (kube-scheduler's field or Volcano's annotation)."""
    template = sts["spec"]["template"]
    return template["spec"].get("schedulingGroup", {}).get("podGroupName") \
        or template["metadata"]["annotations"][VOLCANO_GROUP]


def _count(group: dict) -> int:
    spec = group["spec"]
    return int(spec["minMember"] if "minMember" in spec else spec["schedulingPolicy"]["gang"]["minCount"])


def _pods_per_instance_change(gang: str) -> tuple[list[dict], PruningClient, dict]:
    """Two decode instances of one 4-NPU pod under `gang`, then TP4 x DP2 on 4-NPU nodes (two pods
    each) rolled in place: the first reconcile of the change (decode-1 moves, decode-0 not yet)."""
    body = _two_decodes()
    if gang != "none":
        body["spec"]["scheduling"] = {"gang": gang}
    children = _created(body)
    changed = copy.deepcopy(body)
    changed["spec"]["decode"] |= {"dataParallelSize": 2, "npusPerNode": 4}
    changed["metadata"]["generation"] = 2
    client = PruningClient()
    reconcile_mod.reconcile(client, ProxyStateReader(), changed, children, pods_with_volumes(children))  # type: ignore[arg-type]
    return children, client, changed


def test_mid_rollout_an_unmoved_instance_keeps_its_own_kube_scheduler_podgroup():
    """kube-scheduler's PodGroups are named by a digest of their immutable spec: the spec's new pod
    count is a new group, which only the moved instance's template names; the unmoved instance's
    group (minCount 1, the name its template holds) stays, so a pod of it recreated finds it."""
    children, client, changed = _pods_per_instance_change("kubernetes")
    old = {s["metadata"]["name"]: s for s in of_kind(children, "StatefulSet")}
    observed = {g["metadata"]["name"]: g for g in of_kind(children, "PodGroup")}
    kept = _group_named(old[DECODE[0]])
    assert kept in observed and _count(observed[kept]) == 1
    assert f"PodGroup/{kept}" not in client.deleted, client.deleted
    applied = {m["metadata"]["name"]: m for verb, m in client.writes if verb == "apply"}
    moved = _group_named(_stateful_sets(client.writes)[DECODE[1]])
    assert moved != _group_named(old[DECODE[1]]) and _count(applied[moved]) == 2
    assert f"PodGroup/{_group_named(old[DECODE[1]])}" in client.deleted  # the moved one's old group
    # The spec's group for decode-0 is not created ahead of its move: one group per instance.
    assert [n for n, m in applied.items() if m["kind"] == "PodGroup" and "-decode-" in n] == [moved]

    # Its group deleted by hand: it comes back from the record, as its pods name it (not the spec's).
    without = [c for c in children if c["metadata"]["name"] != kept]
    again = PruningClient()
    reconcile_mod.reconcile(again, ProxyStateReader(), changed, without, pods_with_volumes(children))  # type: ignore[arg-type]
    restored = {m["metadata"]["name"]: m for verb, m in again.writes
                if verb == "apply" and m["kind"] == "PodGroup"}
    assert _count(restored[kept]) == 1 and restored[kept]["spec"] == observed[kept]["spec"]


def test_mid_rollout_an_unmoved_instance_keeps_its_own_volcano_podgroup():
    """Volcano's PodGroup has the instance's name, so the group itself must follow the instance's
    revision: minMember and minResources stay its one pod of 4 NPUs until it moves, where the
    spec's (2 pods, 8 NPUs) would keep its recreated pod waiting for a second that never comes."""
    children, client, _ = _pods_per_instance_change("volcano")
    observed = {g["metadata"]["name"]: g for g in of_kind(children, "PodGroup")}
    assert observed[DECODE[0]]["spec"]["minMember"] == 1
    assert observed[DECODE[0]]["spec"]["minResources"] == {"huawei.com/Ascend910": 4}
    applied = {m["metadata"]["name"]: m for verb, m in client.writes
               if verb == "apply" and m["kind"] == "PodGroup" and "-decode-" in m["metadata"]["name"]}
    assert set(applied) == {DECODE[1]}  # decode-0's group is as it was: nothing to write
    assert applied[DECODE[1]]["spec"]["minMember"] == 2
    assert applied[DECODE[1]]["spec"]["minResources"] == {"huawei.com/Ascend910": 8}
    assert not [d for d in client.deleted if d.startswith("PodGroup/")], client.deleted
    (status,) = [s for verb, s in client.writes if verb == "status"]
    (gang,) = [c for c in status["conditions"] if c["type"] == "GangScheduling"]
    assert f"decode 1 ({DECODE[0]}), decode 2 ({DECODE[1]})" in gang["message"], gang["message"]


class NoKubePodGroups(MemoryClient):
    """A cluster without scheduling.k8s.io/v1alpha2: a kube-scheduler PodGroup is not served."""

    def apply(self, manifest: dict) -> dict:
        if manifest["kind"] == "PodGroup" and manifest["apiVersion"] == "scheduling.k8s.io/v1alpha2":
            raise NotServed("the server could not find the requested resource", manifest)
        return super().apply(manifest)


def test_an_instance_never_applied_is_on_no_revision_and_takes_the_spec_s_podgroup():
    """Gang kubernetes on a cluster without its API stops the apply before the StatefulSets, and
    before the records: so with gang none the instances are created on the spec's template, not held
    to a record of a StatefulSet that never ran and its PodGroup the cluster cannot serve."""
    body = _two_decodes()
    body["spec"]["scheduling"] = {"gang": "kubernetes"}
    refused = NoKubePodGroups()
    with pytest.raises(NotServed):
        reconcile_mod.reconcile(refused, ProxyStateReader(), body, [], [])  # type: ignore[arg-type]
    applied = [m for verb, m in refused.writes if verb in ("apply", "create")]
    assert not of_kind(applied, "StatefulSet") and not _records(applied)
    none = copy.deepcopy(body)
    none["spec"]["scheduling"] = {"gang": "none"}
    none["metadata"]["generation"] = 2
    client = MemoryClient()
    reconcile_mod.reconcile(client, ProxyStateReader(), none, _owned(applied), [])  # type: ignore[arg-type]
    written = [m for verb, m in client.writes if verb == "apply"]
    assert not of_kind(written, "PodGroup") and len(of_kind(written, "StatefulSet")) == 3
    assert all("schedulingGroup" not in s["spec"]["template"]["spec"]
               for s in of_kind(written, "StatefulSet"))


def test_records_of_instances_never_applied_pin_nothing():
    """An operator from before records had their own wave wrote them beside the PodGroups, and a
    PodGroup kind the cluster does not serve stopped the apply there: records of StatefulSets that
    never ran, and no StatefulSet, pod or PodGroup. With the spec switched to gang none, the instances
    take the spec's revision, not those records and their unserved PodGroups, and the records go."""
    body = _two_decodes()
    body["spec"]["scheduling"] = {"gang": "kubernetes"}
    stale = [c for c in _created(body) if c["kind"] not in ("StatefulSet", "PodGroup")]
    assert len(_records(stale)) == 3
    none = copy.deepcopy(body)
    none["spec"]["scheduling"] = {"gang": "none"}
    none["metadata"]["generation"] = 2
    client = PruningClient()
    reconcile_mod.reconcile(client, ProxyStateReader(), none, stale, [])  # type: ignore[arg-type]
    written = [m for verb, m in client.writes if verb == "apply"]
    assert not of_kind(written, "PodGroup") and len(of_kind(written, "StatefulSet")) == 3
    assert all("schedulingGroup" not in s["spec"]["template"]["spec"]
               for s in of_kind(written, "StatefulSet"))
    assert {f"ControllerRevision/{r['metadata']['name']}" for r in _records(stale)} <= set(client.deleted)
    assert len(_records(written)) == 3


def test_an_instance_deleted_with_its_pods_keeps_its_revision():
    """The StatefulSet of an instance not moved yet deleted, and its pods gone too, while the operator
    was down: nothing of it runs, but its PodGroup is there, so its record was applied and it comes
    back on its own revision (the rollout is paused), not the spec's."""
    body = _two_decodes()
    body["spec"]["scheduling"] = {"gang": "kubernetes"}
    children = _created(body)
    old = {s["metadata"]["name"]: s for s in of_kind(children, "StatefulSet")}
    left = [c for c in children if c is not old[DECODE[1]]]
    pods = [p for p in pods_with_volumes(children) if not p["metadata"]["name"].startswith(DECODE[1])]
    client = MemoryClient()
    reconcile_mod.reconcile(client, ProxyStateReader(), _env_changed(body, paused=True), left, pods)  # type: ignore[arg-type]
    restored = _stateful_sets(client.writes)
    assert set(restored) == {DECODE[1]} and restored[DECODE[1]]["spec"] == old[DECODE[1]]["spec"]


# -- prefix routing during a rollout: each prefill cut at its own revision's block ----------------------

def _membership(client: MemoryClient) -> dict:
    (config_map,) = [m for verb, m in client.writes if verb == "apply" and m["kind"] == "ConfigMap"
                     and m["metadata"]["name"] == "glm-flash-1p1d-proxy"]
    return json.loads(config_map["data"]["upstreams.json"])


def _prefill_tp_rollout(recorded: bool) -> tuple[dict, dict, dict]:
    """Two prefill and two decode instances on prefill TP 4 (engine block 1152), then prefill TP 8
    (block 640, another KV layout): the reconcile that surges the first new pair, and the next, with
    that pair Ready beside an old one. (the spec before, after, the last membership written).
    `recorded`: whether the old instances' revision records are observed."""
    body = reconciled_body("glm-5.3-flash-1p1d-tp4.yaml")
    body["spec"]["prefill"]["replicas"] = body["spec"]["decode"]["replicas"] = 2
    changed = copy.deepcopy(body)
    changed["spec"]["prefill"]["tensorParallelSize"] = 8
    changed["metadata"]["generation"] = 2
    children = [c for c in _created(body) if recorded or c["kind"] != "ControllerRevision"]
    pods = pods_with_volumes(children)
    surging = PruningClient()
    reconcile_mod.reconcile(surging, ProxyStateReader(), changed, children, pods)  # type: ignore[arg-type]
    known = {c["metadata"]["name"] for c in children}
    new = _owned([m for verb, m in surging.writes if verb == "apply" and m["metadata"]["name"] not in known])
    assert {s["metadata"]["name"] for s in of_kind(new, "StatefulSet")} == {
        "glm-flash-1p1d-prefill-2", "glm-flash-1p1d-decode-2"}
    both = PruningClient()
    reconcile_mod.reconcile(both, ProxyStateReader(), changed, children + new,  # type: ignore[arg-type]
                            pods + pods_with_volumes(of_kind(new, "StatefulSet")))
    return body, changed, _membership(both)


def test_mid_rollout_each_prefill_carries_its_own_revision_s_block():
    body, changed, doc = _prefill_tp_rollout(recorded=True)
    old, new = resolve(body), resolve(changed)
    assert (old.prefix_hit_tokens("prefill"), new.prefix_hit_tokens("prefill")) == (1152, 640)
    assert old.layout_hash != new.layout_hash
    # Both layouts are routable at once: an old pair and the new one.
    assert {u["name"]: u["layout"] for u in doc["decode"]} == {
        "glm-flash-1p1d-decode-0": old.layout_hash, "glm-flash-1p1d-decode-2": new.layout_hash}
    # The old prefill keeps the block its own engines run (read from its revision record), not the
    # spec's 640 and not none: the proxy goes on cutting its prompts where its prefix cache does.
    assert [{k: u.get(k) for k in ("name", "layout", "blockTokens")} for u in doc["prefill"]] == [
        {"name": "glm-flash-1p1d-prefill-0", "layout": old.layout_hash, "blockTokens": 1152},
        {"name": "glm-flash-1p1d-prefill-2", "layout": new.layout_hash, "blockTokens": 640}]


def test_mid_rollout_a_prefill_without_a_record_of_its_revision_is_routed_by_load_alone():
    body, changed, doc = _prefill_tp_rollout(recorded=False)
    old, new = resolve(body), resolve(changed)
    assert [{k: u.get(k) for k in ("name", "layout", "blockTokens")} for u in doc["prefill"]] == [
        {"name": "glm-flash-1p1d-prefill-0", "layout": old.layout_hash, "blockTokens": None},
        {"name": "glm-flash-1p1d-prefill-2", "layout": new.layout_hash, "blockTokens": 640}]

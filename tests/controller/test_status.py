"""The pure status function: conditions, role figures, the KV layout and events."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from pd_operator.api.conditions import TYPES
from pd_operator.controller import gate, rollout
from pd_operator.controller import status as status_mod
from pd_operator.controller.events import transitions
from pd_operator.controller.restarts import Decision
from pd_operator.controller.status import Observed, merge_patch, shape
from support.controller_fakes import (
    desired,
    link_down,
    pods_of,
    revisions,
    routable_of,
    validated,
    with_figures,
    with_status,
)
from support.specs import example

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def conditions(validation, observed: Observed, *rest) -> list[dict]:
    """status.conditions with the figures the reconcile passes (support.controller_fakes)."""
    return status_mod.conditions(validation, with_figures(validation, observed), *rest)


def status(validation, observed: Observed, *rest) -> dict:
    return status_mod.status(validation, with_figures(validation, observed), *rest)


def _by_type(conds: list[dict]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in conds}


def _serving(validation) -> Observed:
    children = with_status(desired(validation))
    return Observed(children=children, pods=pods_of(children))


def test_nothing_running_yet():
    v = validated()
    got = _by_type(conditions(v, Observed(), [], 1, T0))
    assert got == {"KVCompatible": ("True", "Compatible"), "PrefillReady": ("False", "InstancesNotReady"),
                   "DecodeReady": ("False", "InstancesNotReady"), "ProxyReady": ("False", "ProxyNotReady"),
                   "Ready": ("False", "InstancesNotReady"), "Progressing": ("True", "WaitingForPods"),
                   "Degraded": ("False", "AsExpected"), "GangScheduling": ("True", "SinglePodInstances"),
                   "ScalingLimited": ("False", "WithinBounds"),
                   "ToolsCurrent": ("True", "OperatorTools")}


def test_everything_ready_is_ready_and_complete():
    v = validated()
    st = status(v, _serving(v), {}, 3, T0)
    got = _by_type(st["conditions"])
    assert got["Ready"] == ("True", "Serving") and got["Progressing"] == ("False", "Complete")
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])
    for role, shape_ in (("prefill", "1xTP8"), ("decode", "1xDP2xTP4")):
        revision = st[role]["revision"]
        assert st[role] == {"desiredInstances": 1, "readyInstances": 1, "updatedInstances": 1,
                            "revision": revision, "shape": shape_,
                            "instances": [{"name": f"glm-flash-{role}-0", "revision": revision,
                                           "ready": True}]}
    assert {k: st["kvLayout"][k] for k in ("prefillBlockSize", "decodeBlockSize", "segmentTokens")} == \
        {"prefillBlockSize": 640, "decodeBlockSize": 1152, "segmentTokens": 128}
    # Prefill caches prefixes in the example: its hits land on its 640-token engine block; decode does not.
    assert st["kvLayout"]["prefillPrefixHitTokens"] == 640 and "decodePrefixHitTokens" not in st["kvLayout"]
    assert st["proxyEndpoint"] == "glm-flash-proxy.default.svc:8000"
    assert [c["type"] for c in st["conditions"]] == list(TYPES)


def _link_down(validation) -> Observed:
    children = with_status(desired(validation))
    pods = [link_down(p) if "decode" in p["metadata"]["name"] else p for p in pods_of(children)]
    return Observed(children=children, pods=pods)


def test_a_proxy_without_a_decode_instance_to_route_to_reports_no_upstreams():
    """The gate empties decode in the proxy's membership ConfigMap; the proxy Deployment stays up
    (its pods not Ready: /healthcheck fails without members) and ProxyReady says why."""
    v = validated()
    observed = _link_down(v)
    routable, _ = routable_of(v, observed.pods)
    children = with_status(desired(v), ready_replicas=0)
    listed = Observed(children=children, pods=observed.pods, routable=routable)
    got = {c["type"]: c for c in conditions(v, listed, [], 1, T0)}
    assert (got["ProxyReady"]["status"], got["ProxyReady"]["reason"]) == ("False", "NoUpstreams")
    assert "no decode instance" in got["ProxyReady"]["message"]
    # Ungated (every instance listed), the same unready proxy is just not ready yet.
    got = {c["type"]: c for c in conditions(v, Observed(children=with_status(desired(v), ready_replicas=0),
                                                        pods=observed.pods), [], 1, T0)}
    assert (got["ProxyReady"]["status"], got["ProxyReady"]["reason"]) == ("False", "ProxyNotReady")


def test_a_decode_instance_without_a_kv_link_is_not_ready_and_says_why():
    v = validated()
    got = {c["type"]: c for c in conditions(v, _link_down(v), [], 1, T0)}
    assert (got["DecodeReady"]["status"], got["DecodeReady"]["reason"]) == ("False", "KVLinkNotReady")
    message = got["DecodeReady"]["message"]
    assert "glm-flash-decode-0" in message and "status.kvLinks" in message
    assert got["PrefillReady"]["status"] == "True"
    assert (got["Ready"]["status"], got["Ready"]["reason"]) == ("False", "KVLinkNotReady")


def test_kv_links_are_reported_as_computed():
    v = validated()
    links = [{"decode": "glm-flash-decode-0", "prefill": "glm-flash-prefill-0", "linked": True,
              "latencyMs": 3.5, "gbps": 1.25}]
    serving = _serving(v)
    st = status(v, Observed(children=serving.children, pods=serving.pods, links=links), {}, 1, T0)
    assert st["kvLinks"] == links
    kept = status(v, serving, st, 1, T1)  # not computed this time: the previous stays
    assert kept["kvLinks"] == links


def test_an_instance_whose_ranks_run_two_kv_layouts_is_not_ready():
    v = validated(decode__npusPerNode=4)  # two pods per decode instance
    children = with_status(desired(v))
    pods = pods_of(children)
    for p in pods:  # one rank replaced by a rollout, the other not yet
        if p["metadata"]["name"] == "glm-flash-decode-0-1":
            p["metadata"]["labels"] = {**p["metadata"]["labels"], "pd.serving.dev/kv-layout": "old"}
    got = _by_type(conditions(v, Observed(children=children, pods=pods), [], 1, T0))
    assert got["PrefillReady"][0] == "True" and got["DecodeReady"][0] == "False"
    all_old = Observed(children=children, pods=pods_of(children, layout="old"))
    old = _by_type(conditions(v, all_old, [], 1, T0))
    assert old["DecodeReady"][0] == "True"  # all on the old layout: it serves with prefill of that layout


def test_a_missing_rank_keeps_a_multi_pod_instance_not_ready():
    v = validated(decode__npusPerNode=4)  # DP2xTP4 on 4-NPU nodes: two pods per decode instance
    children = with_status(desired(v))
    pods = [p for p in pods_of(children) if p["metadata"]["name"] != "glm-flash-decode-0-1"]
    got = _by_type(conditions(v, Observed(children=children, pods=pods), [], 1, T0))
    assert got["DecodeReady"] == ("False", "InstancesNotReady") and got["PrefillReady"][0] == "True"


UNSCHEDULABLE = ("0/12 nodes are available: 8 Insufficient huawei.com/Ascend910, 4 node(s) didn't match "
                 "Pod's node affinity/selector.")


def _pending(pods: list[dict], name: str, message: str = UNSCHEDULABLE) -> list[dict]:
    """`pods` with `name` not bound to a node and its PodScheduled condition False, as the
    scheduler leaves a pod it cannot place."""
    out = []
    for p in pods:
        if p["metadata"]["name"] == name:
            p = {**p, "spec": {}, "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}
        out.append(p)
    return out


def _unschedulable(v, name: str) -> Observed:
    children = with_status(desired(v))
    return Observed(children=children, pods=_pending(pods_of(children), name))


def test_a_pod_the_scheduler_cannot_place_is_reported_with_its_message():
    v = validated(decode__npusPerNode=4)  # two pods per decode instance
    conds = {c["type"]: c for c in conditions(v, _unschedulable(v, "glm-flash-decode-0-1"), [], 1, T0)}
    decode = conds["DecodeReady"]
    assert (decode["status"], decode["reason"]) == ("False", "Unschedulable")
    assert decode["message"] == ("0 of 1 decode instances are ready; pod glm-flash-decode-0-1 cannot be "
                                 f"scheduled: {UNSCHEDULABLE}")
    assert (conds["Ready"]["reason"], conds["Ready"]["message"]) == ("Unschedulable", decode["message"])
    assert conds["PrefillReady"]["reason"] == "InstancesReady"
    # Not "just starting": a Warning event says so at once.
    assert ("Warning", "Unschedulable") in [(t, r) for t, r, _ in transitions([], list(conds.values()))]


def test_a_scheduled_pod_that_is_not_ready_is_only_starting():
    v = validated()
    children = with_status(desired(v))
    pods = pods_of(children, ready=False)
    for p in pods:
        p["spec"] = {"nodeName": "node-1"}
        p["status"]["conditions"].append({"type": "PodScheduled", "status": "True"})
    got = _by_type(conditions(v, Observed(children=children, pods=pods), [], 1, T0))
    assert got["PrefillReady"] == got["DecodeReady"] == ("False", "InstancesNotReady")


def test_last_transition_time_moves_only_when_the_status_does():
    v = validated()
    first = conditions(v, Observed(), [], 1, T0)
    again = conditions(v, Observed(), first, 1, T1)
    assert [c["lastTransitionTime"] for c in again] == [T0] * len(again)
    ready = conditions(v, _serving(v), again, 1, T1)
    moved = {c["type"] for c in ready if c["lastTransitionTime"] == T1}
    assert moved == {"PrefillReady", "DecodeReady", "ProxyReady", "Ready", "Progressing"}


def test_incompatible_spec_names_the_field_and_keeps_the_last_layout():
    v = validated(example("incompatible-glm-tp8-tp3.yaml"))
    layout = {"prefillBlockSize": 640, "decodeBlockSize": 640, "segmentTokens": 640, "hash": "before"}
    previous = {"kvLayout": layout, "conditions": []}
    st = status(v, Observed(), previous, 2, T0)
    got = {c["type"]: c for c in st["conditions"]}
    kv = got["KVCompatible"]
    assert (kv["status"], kv["reason"]) == ("False", "HeadsNotDivisibleByTP")
    assert "spec.decode.tensorParallelSize" in got["KVCompatible"]["message"]
    assert got["Ready"]["status"] == "False" and "unchanged" in got["Ready"]["message"]
    assert got["Progressing"]["reason"] == "InvalidSpec"
    assert st["kvLayout"] == layout and st["observedGeneration"] == 2


@pytest.mark.parametrize(("observed", "reason"), [
    (Observed(foreign=[{"kind": "Service", "metadata": {"name": "x"}}]), "ForeignChild"),
    (Observed(blocked=[{"kind": "Service", "metadata": {"name": "x"}}]), "NameConflict"),
    (Observed(restarts=[Decision("d-0", "restart", ("p-1",), ("p-0", "p-1"))]), "GroupRestart"),
    (Observed(restarts=[Decision("d-0", "limited", ("p-1",))]), "GroupRestartLimited"),
])
def test_degraded_reasons(observed, reason):
    got = _by_type(conditions(validated(), observed, [], 1, T0))
    assert got["Degraded"] == ("True", reason)


def _rolling(v, *, paused: bool = False, halted: bool = False, blocked: str | None = None) -> Observed:
    """prefill-1 of two still runs an old template; the rollout as the reconcile would see it."""
    children = with_status(desired(v))
    pods = pods_of(children)
    for p in pods:
        if p["metadata"]["name"].startswith("glm-flash-prefill-1"):
            p["metadata"]["labels"] = {**p["metadata"]["labels"], "pd.serving.dev/revision": "old"}
    state = gate.observe(v.resolved, revisions(v), pods, ())
    params = {role: replace(p, paused=paused) for role, p in
              rollout.params_of(v.resolved, {"prefill"} if halted else set()).items()}
    step = rollout.plan(params, state, v.resolved.layout_hash)
    step = replace(step, blocked=blocked) if blocked else step
    since = datetime(2026, 1, 1, tzinfo=UTC)
    moving = rollout.Rollout(step, state, params, since, {"prefill": 60, "decode": 60})
    return Observed(children=children, pods=pods, rollout=moving)


@pytest.mark.parametrize(("flags", "expected"), [
    ({}, ("True", "RolloutInProgress")),
    ({"paused": True}, ("Unknown", "RolloutPaused")),
    ({"halted": True}, ("False", "ProgressDeadlineExceeded")),
    ({"blocked": "No outdated prefill instance can leave"}, ("False", "RolloutBlocked")),
])
def test_a_rollout_is_progressing_and_says_how(flags, expected):
    v = validated(prefill__replicas=2)
    observed = _rolling(v, **flags)
    got = {c["type"]: c for c in conditions(v, observed, [], 1, T0)}
    assert (got["Progressing"]["status"], got["Progressing"]["reason"]) == expected
    assert got["Ready"]["status"] == "True"  # the old and new instances serve meanwhile
    assert "prefill 1 of 2" in got["Progressing"]["message"] or flags.get("blocked")


def test_status_reports_each_instance_revision_and_the_updated_count():
    v = validated(prefill__replicas=2)
    observed = _rolling(v)
    out = status(v, observed, {}, 3, T0)
    assert out["prefill"]["updatedInstances"] == 1 and out["prefill"]["readyInstances"] == 2
    assert {i["name"]: i["revision"] for i in out["prefill"]["instances"]} == {
        "glm-flash-prefill-0": out["prefill"]["revision"], "glm-flash-prefill-1": "old"}
    assert out["rolloutProgressTime"] == "2026-01-01T00:00:00Z"


def test_a_stopped_rollout_posts_a_warning_event():
    v = validated(prefill__replicas=2)
    before = conditions(v, _rolling(v), [], 1, T0)
    after = conditions(v, _rolling(v, halted=True), before, 1, T1)
    assert [(t, r) for t, r, _ in transitions(before, after)] == [("Warning", "ProgressDeadlineExceeded")]


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, "1xTP8"), ({"prefill__replicas": 3}, "3xTP8"),
    ({"prefill__dataParallelSize": 2, "prefill__tensorParallelSize": 4}, "1xDP2xTP4"),
    ({"prefill__pipelineParallelSize": 2, "prefill__npusPerNode": 16}, "1xTP8xPP2"),
])
def test_shape(changes, expected):
    dep = validated(**changes).deployment
    assert dep is not None and shape(dep, "prefill") == expected


def test_events_only_for_significant_transitions():
    v = validated()
    first = conditions(v, Observed(), [], 1, T0)
    assert transitions([], first) == [("Normal", "Compatible", first[0]["message"])]  # starting is no news
    assert transitions(first, conditions(v, Observed(), first, 1, T1)) == []
    ready = conditions(v, _serving(v), first, 1, T1)
    assert [(t, r) for t, r, _ in transitions(first, ready)] == [("Normal", "Serving")]
    degraded = conditions(v, Observed(foreign=[{"kind": "Service", "metadata": {"name": "x"}}]), ready, 1, T1)
    assert ("Warning", "ForeignChild") in [(t, r) for t, r, _ in transitions(ready, degraded)]


def test_every_reason_the_status_gives_is_documented():
    from pd_operator.api.conditions import FINDING, REASONS
    from pd_operator.findings import CATALOG

    documented = {(t, s, r) for t, s, r, _ in REASONS}
    v = validated()
    children = with_status(desired(v))
    scenarios = [
        (v, Observed()), (v, _serving(v)),
        *((validated(prefill__replicas=2), _rolling(validated(prefill__replicas=2), **flags))
          for flags in ({}, {"paused": True}, {"halted": True}, {"blocked": "held"})),
        (validated(prefill__replicas=0), Observed()),
        (validated(proxy__enabled=False), _serving(validated(proxy__enabled=False))),
        (v, _link_down(v)),
        (validated(example("incompatible-glm-tp8-tp3.yaml")), Observed()),
        (v, _unschedulable(v, "glm-flash-prefill-0-0")),
        (v, Observed(children=[{**c, "spec": {**c["spec"], "replicas": 0}} if c["kind"] == "Deployment" else c
                               for c in children], pods=pods_of(children))),
        *((v, o) for o in [Observed(foreign=[{"kind": "Service", "metadata": {"name": "x"}}]),
                           Observed(blocked=[{"kind": "Service", "metadata": {"name": "x"}}]),
                           Observed(restarts=[Decision("d-0", "restart", ("p",), ("p",))]),
                           Observed(restarts=[Decision("d-0", "limited", ("p",))])]),
    ]
    for validation, observed in scenarios:
        for c in conditions(validation, observed, [], 1, T0):
            reason = FINDING if c["reason"] in CATALOG and c["type"] in ("KVCompatible",) else c["reason"]
            if c["type"] == "Ready" and c["status"] == "False":
                reason = "<reason of the first failing condition>"
            assert (c["type"], c["status"], reason) in documented, c


def _gang(validation, observed: Observed) -> dict:
    return next(c for c in conditions(validation, observed, [], 1, T0) if c["type"] == "GangScheduling")


def test_gang_condition_says_when_an_instance_can_be_placed_in_part():
    multi = validated(decode__dataParallelSize=4)  # 2 pods per decode instance
    got = _gang(multi, _serving(multi))
    assert (got["status"], got["reason"]) == ("False", "PartialPlacementPossible")
    assert "decode instances (2 pods each)" in got["message"] and "spec.scheduling.gang" in got["message"]
    assert _by_type(conditions(multi, _serving(multi), [], 1, T0))["Ready"] == ("True", "Serving")
    volcano = validated(decode__dataParallelSize=4, scheduling={"gang": "volcano"})
    got = _gang(volcano, _serving(volcano))
    assert (got["status"], got["reason"]) == ("True", "PodGroups")
    assert "Volcano PodGroup" in got["message"] and "decode 2" in got["message"]


@pytest.mark.parametrize("gang", ["none", "volcano"])
def test_mid_rollout_the_gang_condition_gives_each_instance_its_own_pod_count(gang):
    """Decode DP2 -> DP4 (1 -> 2 pods per instance) mid-rollout: decode-1 moved, decode-0 runs its own
    revision's one pod (observed.sizes, from its record), so its PodGroup waits for 1, not the spec's 2."""
    v = validated(decode__replicas=2, decode__dataParallelSize=4, scheduling={"gang": gang})
    observed = replace(_serving(v), sizes={("decode", 0): 1, ("decode", 1): 2})
    mid, moved = {"none": ("decode instances (2 pods each: glm-flash-decode-1)",
                           "decode instances (2 pods each)"),
                  "volcano": ("prefill 1, decode 1 (glm-flash-decode-0), decode 2 (glm-flash-decode-1)",
                              "prefill 1, decode 2)")}[gang]
    assert mid in _gang(v, observed)["message"]
    assert moved in _gang(v, _serving(v))["message"]  # all moved: one count for the role


def test_a_podgroup_kind_not_served_blocks_ready_and_says_what_to_enable():
    v = validated(decode__dataParallelSize=4, scheduling={"gang": "kubernetes"})
    group = next(m for m in desired(v) if m["kind"] == "PodGroup")
    observed = Observed(unserved=group, unserved_error="the server could not find the requested resource")
    got = {c["type"]: c for c in conditions(v, observed, [], 1, T0)}
    assert (got["GangScheduling"]["status"], got["GangScheduling"]["reason"]) == ("False", "GangUnavailable")
    assert "--runtime-config=scheduling.k8s.io/v1alpha2=true" in got["GangScheduling"]["message"]
    assert (got["Ready"]["status"], got["Ready"]["reason"]) == ("False", "GangUnavailable")


def test_a_dropped_topology_constraint_is_reported():
    v = validated(decode__dataParallelSize=4, scheduling={"gang": "kubernetes"},
                  placement={"domainLabel": "example.com/super-pod", "gangTopology": True})
    children = with_status(desired(v))
    for child in children:  # what a kube-apiserver without TopologyAwareWorkloadScheduling stores
        if child["kind"] == "PodGroup":
            child["spec"].pop("schedulingConstraints")
    got = _gang(v, Observed(children=children, pods=pods_of(children)))
    assert (got["status"], got["reason"]) == ("False", "GangUnavailable")
    assert "TopologyAwareWorkloadScheduling" in got["message"]
    assert _gang(v, _serving(v))["reason"] == "PodGroups"
    # The group of an instance not moved yet from a revision before gangTopology has none: not dropped.
    before = validated(decode__dataParallelSize=4, scheduling={"gang": "kubernetes"},
                       placement={"domainLabel": "example.com/super-pod"})
    kept = [m for m in with_status(desired(before)) if m["kind"] == "PodGroup"]
    serving = _serving(v)
    assert _gang(v, replace(serving, children=[*serving.children, *kept]))["reason"] == "PodGroups"


def test_a_key_the_new_status_drops_is_patched_to_null():
    previous = {"observedGeneration": 1, "draining": [{"name": "glm-flash-decode-1"}],
                "proxyEndpoint": "x:8000"}
    new = {"observedGeneration": 2}
    assert merge_patch(previous, new) == {"observedGeneration": 2, "draining": None,
                                                      "proxyEndpoint": None}
    assert merge_patch(new, new) == new


def test_a_key_dropped_inside_an_object_is_patched_to_null():
    previous = {"kvLayout": {"prefillBlockSize": 640, "prefillPrefixHitTokens": 640}}
    new = {"kvLayout": {"prefillBlockSize": 640}}
    patch = merge_patch(previous, new)
    assert patch == {"kvLayout": {"prefillBlockSize": 640, "prefillPrefixHitTokens": None}}


@pytest.mark.parametrize(("surge_pods", "under_way"), [(True, True), (False, False)])
def test_a_rollout_is_under_way_until_its_surge_instances_are_gone(surge_pods, under_way):
    """Every instance is updated and Ready; a surge instance (prefill-2 of 2) still drains. The
    rollout is under way (Progressing=True, naming it) until it is gone: it holds NPUs meanwhile."""
    v = validated(prefill__replicas=2)
    pods = pods_of(with_status(desired(validated(prefill__replicas=3 if surge_pods else 2))))
    body = {"metadata": {"uid": "u"}, "status": {"rolloutProgressTime": "2026-01-01T00:00:00Z"}}
    assert v.resolved is not None
    state = gate.observe(v.resolved, revisions(v), pods, ())
    figures = rollout.figures(v.resolved, revisions(v), pods)
    moving = rollout.step(v.resolved, state, figures, body["status"], datetime(2026, 1, 1, 0, 1, tzinfo=UTC))
    assert (moving.since is not None) == under_way
    got = {c["type"]: c for c in conditions(v, Observed(children=with_status(desired(v)), pods=pods,
                                                        rollout=moving), [], 1, T0)}
    if under_way:
        assert (got["Progressing"]["status"], got["Progressing"]["reason"]) == ("True", "RolloutInProgress")
        assert "surge instances running: glm-flash-prefill-2" in got["Progressing"]["message"]
    else:
        assert (got["Progressing"]["status"], got["Progressing"]["reason"]) == ("False", "Complete")


def test_each_instance_shows_the_vllm_ascend_its_leader_pod_reported():
    """The kubelet puts the pd-image-report init container's termination message into the pod's
    status; the status shows it per instance (the leader's), and nothing where there is none."""
    v = validated(prefill__replicas=2)
    pods = pods_of(with_status(desired(v)))
    message = '{"vllmAscend": {"version": "0.30.0rc2", "commit": "1a2b3c4", "seedChange": true}}'
    for pod in pods:
        if pod["metadata"]["name"] == "glm-flash-prefill-1-0":
            pod["status"]["initContainerStatuses"] = [
                {"name": "pd-tools", "state": {"terminated": {"exitCode": 0, "message": message}}},
                {"name": "pd-image-report", "state": {"terminated": {"exitCode": 0, "message": message}}}]
        if pod["metadata"]["name"] == "glm-flash-prefill-0-0":  # another container's message is not it
            pod["status"]["initContainerStatuses"] = [
                {"name": "pd-tools", "state": {"terminated": {"exitCode": 0, "message": message}}}]
    out = status(v, Observed(children=with_status(desired(v)), pods=pods), {}, 3, T0)
    assert {i["name"]: i.get("vllmAscend") for i in out["prefill"]["instances"]} == {
        "glm-flash-prefill-0": None, "glm-flash-prefill-1": "0.30.0rc2 (commit 1a2b3c4), seed change"}


def test_a_held_partition_is_not_complete():
    """Every instance at or above the partition is updated and Ready, instance 0 of each role is
    held on the old template: Progressing names it (RolloutPartitioned), not Complete."""
    v = validated(prefill__replicas=2, decode__replicas=2,
                  prefill__rollout={"partition": 1}, decode__rollout={"partition": 1})
    assert v.resolved is not None
    layout = v.resolved.layout_hash
    state = {role: {0: rollout.InstanceState(False, True, layout),
                    1: rollout.InstanceState(True, True, layout)} for role in ("prefill", "decode")}
    pods = pods_of(with_status(desired(v)))
    figures = rollout.figures(v.resolved, revisions(v), pods)
    moving = rollout.step(v.resolved, state, figures, {}, datetime(2026, 1, 1, tzinfo=UTC))
    assert moving.since is None
    got = {c["type"]: c for c in conditions(v, Observed(children=with_status(desired(v)), pods=pods,
                                                        rollout=moving), [], 1, T0)}
    assert (got["Progressing"]["status"], got["Progressing"]["reason"]) == ("False", "RolloutPartitioned")
    assert "glm-flash-prefill-0" in got["Progressing"]["message"]
    assert "glm-flash-decode-0" in got["Progressing"]["message"]


def test_a_surge_instance_that_cannot_be_scheduled_says_so_and_what_to_set():
    """The defaults (one surge instance, none unavailable) with no NPUs free for the surge: its pod
    stays Pending, no outdated instance may leave, and Progressing says why and what to set."""
    v = validated()
    assert v.resolved is not None
    pods = pods_of(with_status(desired(validated(prefill__replicas=2))))
    for p in pods:
        if p["metadata"]["name"].startswith("glm-flash-prefill-0"):
            p["metadata"]["labels"] = {**p["metadata"]["labels"], "pd.serving.dev/revision": "old"}
    pods = _pending(pods, "glm-flash-prefill-1-0")
    state = gate.observe(v.resolved, revisions(v), pods, ())
    params = rollout.params_of(v.resolved)
    step = rollout.plan(params, state, v.resolved.layout_hash)
    assert step.instances["prefill"] == {0, 1} and not step.leave and step.blocked is None
    moving = rollout.Rollout(step, state, params, datetime(2026, 1, 1, tzinfo=UTC),
                             {"prefill": 60, "decode": 60})
    got = {c["type"]: c for c in conditions(v, Observed(children=with_status(desired(v)), pods=pods,
                                                        rollout=moving), [], 1, T0)}
    progressing = got["Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("False", "SurgeUnschedulable")
    assert "glm-flash-prefill-1-0" in progressing["message"] and UNSCHEDULABLE in progressing["message"]
    assert "spec.prefill.rollout to maxSurge 0 and maxUnavailable 1" in progressing["message"]
    assert got["Ready"]["status"] == "True"  # the old instance serves meanwhile

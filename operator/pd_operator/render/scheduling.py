"""Gang scheduling and network placement of serving instances. Pure.

An instance of several pods (external DP over nodes) serves only when all its pods run, so each
instance gets one PodGroup whose minimum is its pod count, and its pods name that group: the
scheduler then binds all of them or none, and a half-placed instance never holds NPUs it cannot use.

- `volcano`: Volcano's PodGroup (volcano.sh/apis: pkg/apis/scheduling/v1beta1/types.go PodGroupSpec
  @ v1.13.0: minMember, minResources, queue, priorityClassName); pods carry the annotation
  `scheduling.k8s.io/group-name` and `schedulerName: volcano`. minResources is the instance's NPUs,
  the resource Volcano's enqueue step must find room for before it admits the group.
- `kubernetes`: kube-scheduler's PodGroup (k8s.io/api: scheduling/v1alpha2/types.go @ v0.36.3:
  spec.schedulingPolicy.gang.minCount, spec.schedulingConstraints.topology) and the pod field
  `spec.schedulingGroup.podGroupName` (k8s.io/api: core/v1/types.go PodSchedulingGroup @ v0.36.3).
  Its spec is immutable (k8s.io/kubernetes: pkg/scheduler/framework/plugins/gangscheduling/
  gangscheduling.go @ v1.36.3: "PodGroups are immutable"), so its name carries a digest of the spec:
  a new pod count is a new PodGroup, and the diff prunes the old one.

Placement by network domain (`spec.placement.domainLabel`) is pod affinity, which every scheduler
honours: all pods of an instance in the domain of its first pod (required), decode near prefill and
instances of a role apart (preferred). The user's own affinity terms are kept.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pd_operator.api.labels import INSTANCE, VOLCANO_GROUP
from pd_operator.render.labels import metadata, selector
from pd_operator.spec.validate import Resolved

VOLCANO_API = "scheduling.volcano.sh/v1beta1"
KUBE_API = "scheduling.k8s.io/v1alpha2"
# Volcano's scheduler serves pods of this schedulerName by default (volcano.sh/volcano:
# cmd/scheduler/app/options/options.go defaultSchedulerName @ v1.13.0).
VOLCANO_SCHEDULER = "volcano"
# What a cluster needs to serve each PodGroup kind (the status says it when the kind is missing):
# the feature gates are k8s.io/kubernetes: pkg/features/kube_features.go @ v1.36.3 (both alpha, off
# by default), the group version is off by default as every alpha API.
NEEDS = {
    KUBE_API: "kube-apiserver and kube-scheduler with --feature-gates=GenericWorkload=true,"
              "GangScheduling=true and kube-apiserver with --runtime-config=scheduling.k8s.io/v1alpha2=true",
    VOLCANO_API: "Volcano installed (its CRD podgroups.scheduling.volcano.sh and its scheduler)",
}
TOPOLOGY_GATE = "TopologyAwareWorkloadScheduling"
IMMUTABLE_SPEC = {(KUBE_API, "PodGroup")}
"""(apiVersion, kind) whose spec cannot change after creation (see the module docstring)."""
DIGEST_CHARS = 8
# Preferred terms: near prefill outweighs apart from the role's other instances, so with prefill in
# one domain only, decode still joins it (KV moves within the domain) rather than spreading out.
NEAR_PREFILL_WEIGHT = 100
SPREAD_WEIGHT = 50


def _digest(spec: dict) -> str:
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


@dataclass(frozen=True)
class _Gang:
    """What one instance's PodGroup holds: from the spec (`_current`) or from the StatefulSet of the
    revision the instance is on (`recorded_pod_group`)."""
    api: str
    pods: int
    npus_per_pod: int
    priority_class: str | None
    topology: str | None
    """kube-scheduler's only: the key of its topology constraint."""


def _current(ctx: Resolved, role: str) -> _Gang | None:
    scheduling, placement, plan = ctx.deployment.spec.scheduling, ctx.deployment.spec.placement, \
        ctx.shapes[role]
    if scheduling.gang == "none":
        return None
    return _Gang(KUBE_API if scheduling.gang == "kubernetes" else VOLCANO_API, plan.pods, plan.npus_per_pod,
                 scheduling.priority_class_name, placement.domain_label if placement.gang_topology else None)


def _spec(ctx: Resolved, role: str, gang: _Gang) -> dict:
    spec: dict
    if gang.api == KUBE_API:
        spec = {"schedulingPolicy": {"gang": {"minCount": gang.pods}}}
        if gang.topology:
            spec["schedulingConstraints"] = {"topology": [{"key": gang.topology}]}
        return spec
    spec = {"minMember": gang.pods,
            "minResources": {ctx.role(role).npu_resource_name: gang.pods * gang.npus_per_pod}}
    if queue := ctx.deployment.spec.scheduling.queue:
        spec["queue"] = queue
    if gang.priority_class:
        spec["priorityClassName"] = gang.priority_class
    return spec


def _name(ctx: Resolved, role: str, index: int, gang: _Gang) -> str:
    if gang.api == KUBE_API:
        return ctx.names.pod_group(role, index, _digest(_spec(ctx, role, gang)))
    return ctx.names.pod_group(role, index)


def _group(ctx: Resolved, role: str, index: int, gang: _Gang) -> dict:
    return {"apiVersion": gang.api, "kind": "PodGroup",
            "metadata": metadata(ctx, _name(ctx, role, index, gang), role, index),
            "spec": _spec(ctx, role, gang)}


def pod_group_name(ctx: Resolved, role: str, index: int) -> str | None:
    """The PodGroup the instance's pods belong to (None without gang scheduling)."""
    gang = _current(ctx, role)
    return None if gang is None else _name(ctx, role, index, gang)


def pod_group(ctx: Resolved, role: str, index: int) -> dict | None:
    """One instance's PodGroup on the spec's current shape, or None with gang `none`."""
    gang = _current(ctx, role)
    return None if gang is None else _group(ctx, role, index, gang)


def _topology_keys(affinity: object) -> list[str]:
    """Every topologyKey in a pod's affinity terms."""
    if isinstance(affinity, dict):
        own = [affinity["topologyKey"]] if isinstance(affinity.get("topologyKey"), str) else []
        return own + [k for v in affinity.values() for k in _topology_keys(v)]
    if isinstance(affinity, list):
        return [k for v in affinity for k in _topology_keys(v)]
    return []


def recorded_pod_group(ctx: Resolved, role: str, index: int, stateful_set: dict) -> dict | None:
    """The PodGroup that the pods of `stateful_set` (instance `index` of `role` as a revision record
    of it has it, controller/revisions.py) need, whatever the spec says now: the kind and name its
    template names (None: no gang), minMember/minCount its `replicas`, minResources from its pods'
    own NPU requests, Volcano's priorityClassName its pods'. kube-scheduler's name is a digest of its
    spec, whose topology constraint the template does not hold: it is the candidate (the spec's, none,
    a topologyKey of the template's affinity) whose spec has that digest, as an apply under the name
    must not change the immutable spec; None if none has (the group then is not rendered)."""
    template = stateful_set["spec"]["template"]
    pod = template["spec"]
    pods = int(stateful_set["spec"]["replicas"])
    resource = ctx.role(role).npu_resource_name
    npus = sum(int(((c.get("resources") or {}).get("requests") or {}).get(resource, 0))
               for c in pod.get("containers") or [])
    priority = pod.get("priorityClassName")
    api, named = named_group(template) or (None, None)
    if api == KUBE_API:
        now = _current(ctx, role)
        candidates = [now.topology if now else None, None, *_topology_keys(pod.get("affinity"))]
        for topology in dict.fromkeys(candidates):
            gang = _Gang(KUBE_API, pods, npus, priority, topology)
            if _name(ctx, role, index, gang) == named:
                return _group(ctx, role, index, gang)
        return None
    if api == VOLCANO_API:
        return _group(ctx, role, index, _Gang(VOLCANO_API, pods, npus, priority, None))
    return None


def named_group(template: dict) -> tuple[str, str] | None:
    """(apiVersion, name) of the PodGroup the pods of a StatefulSet's pod `template` name: the in-tree
    field or Volcano's annotation (None: no gang)."""
    if named := (template["spec"].get("schedulingGroup") or {}).get("podGroupName"):
        return KUBE_API, named
    if named := (template["metadata"].get("annotations") or {}).get(VOLCANO_GROUP):
        return VOLCANO_API, named
    return None


def pod_annotations(ctx: Resolved, role: str, index: int) -> dict[str, str]:
    name = pod_group_name(ctx, role, index)
    return {VOLCANO_GROUP: name} if name and ctx.deployment.spec.scheduling.gang == "volcano" else {}


def pod_spec_fields(ctx: Resolved, role: str, index: int) -> dict:
    """schedulerName, priorityClassName and the in-tree PodGroup reference, where set."""
    scheduling = ctx.deployment.spec.scheduling
    out: dict = {}
    scheduler = scheduling.scheduler_name or (VOLCANO_SCHEDULER if scheduling.gang == "volcano" else None)
    if scheduler:
        out["schedulerName"] = scheduler
    if scheduling.priority_class_name:
        out["priorityClassName"] = scheduling.priority_class_name
    name = pod_group_name(ctx, role, index)
    if name and scheduling.gang == "kubernetes":
        out["schedulingGroup"] = {"podGroupName": name}
    return out


def _term(match_labels: dict[str, str], topology_key: str, expressions: list[dict] | None = None) -> dict:
    labels: dict = {"matchLabels": match_labels}
    if expressions:
        labels["matchExpressions"] = expressions
    return {"labelSelector": labels, "topologyKey": topology_key}


def add_placement(ctx: Resolved, role: str, index: int, affinity: dict) -> dict:
    """`affinity` (already the user's terms plus the operator's, a private copy) with the network
    domain terms of spec.placement added."""
    domain = ctx.deployment.spec.placement.domain_label
    if domain is None:
        return affinity
    if ctx.shapes[role].multi_pod:
        # The first pod of an instance matches its own term, so the scheduler lets it pick the
        # domain (k8s.io/kubernetes: pkg/scheduler/framework/plugins/interpodaffinity/filtering.go
        # satisfyPodAffinity @ v1.36.3); the others must join it.
        affinity.setdefault("podAffinity", {}).setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", []).append(
            _term(selector(ctx, role, index), domain))
    if role == "decode" and ctx.deployment.spec.prefill.replicas > 0:
        affinity.setdefault("podAffinity", {}).setdefault(
            "preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": NEAR_PREFILL_WEIGHT, "podAffinityTerm": _term(selector(ctx, "prefill"), domain)})
    if ctx.role(role).replicas > 1:
        others = [{"key": INSTANCE, "operator": "NotIn", "values": [str(index)]}]
        affinity.setdefault("podAntiAffinity", {}).setdefault(
            "preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": SPREAD_WEIGHT,
             "podAffinityTerm": _term(selector(ctx, role), domain, others)})
    return affinity

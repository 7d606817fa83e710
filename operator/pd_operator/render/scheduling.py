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


def _kube_spec(ctx: Resolved, role: str) -> dict:
    spec: dict = {"schedulingPolicy": {"gang": {"minCount": ctx.shapes[role].pods}}}
    placement = ctx.deployment.spec.placement
    if placement.gang_topology and placement.domain_label:
        spec["schedulingConstraints"] = {"topology": [{"key": placement.domain_label}]}
    return spec


def _volcano_spec(ctx: Resolved, role: str) -> dict:
    plan, side, scheduling = ctx.shapes[role], ctx.role(role), ctx.deployment.spec.scheduling
    spec: dict = {"minMember": plan.pods,
                  "minResources": {side.npu_resource_name: plan.pods * plan.npus_per_pod}}
    if scheduling.queue:
        spec["queue"] = scheduling.queue
    if scheduling.priority_class_name:
        spec["priorityClassName"] = scheduling.priority_class_name
    return spec


def pod_group_name(ctx: Resolved, role: str, index: int) -> str | None:
    """The PodGroup the instance's pods belong to (None without gang scheduling)."""
    gang = ctx.deployment.spec.scheduling.gang
    if gang == "kubernetes":
        return ctx.names.pod_group(role, index, _digest(_kube_spec(ctx, role)))
    if gang == "volcano":
        return ctx.names.pod_group(role, index)
    return None


def pod_group(ctx: Resolved, role: str, index: int) -> dict | None:
    """One instance's PodGroup, or None with gang `none`."""
    name = pod_group_name(ctx, role, index)
    if name is None:
        return None
    kube = ctx.deployment.spec.scheduling.gang == "kubernetes"
    return {"apiVersion": KUBE_API if kube else VOLCANO_API, "kind": "PodGroup",
            "metadata": metadata(ctx, name, role, index),
            "spec": _kube_spec(ctx, role) if kube else _volcano_spec(ctx, role)}


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

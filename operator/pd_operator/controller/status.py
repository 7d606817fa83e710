"""The PDDeployment's status from its validation and its observed children. Pure: the caller
passes the clock, the previous conditions and everything observed.

Conditions follow the Kubernetes conventions: a CamelCase reason, a message a user can act on,
the generation they describe, and a lastTransitionTime that only moves when the status does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import ValidationError

from pd_operator.api import conditions as c
from pd_operator.api.labels import POD_INDEX
from pd_operator.api.types import (
    ROLES,
    Condition,
    DrainingStatus,
    InstanceStatus,
    KVLayoutStatus,
    KVLinkStatus,
    PDDeployment,
    PDDeploymentStatus,
    RoleStatus,
)
from pd_operator.controller.links import link_ready
from pd_operator.controller.pods import by_instance, instance_ready, label, unschedulable
from pd_operator.controller.restarts import Decision
from pd_operator.controller.revisions import Sizes, expected_pods
from pd_operator.controller.rollout import Figures, RoleFigures, Rollout, revision_of, surplus
from pd_operator.findings import Finding
from pd_operator.render import Routable, scheduling, tools
from pd_operator.serving_image.installed import read_report
from pd_operator.spec.scaling import Bounded
from pd_operator.spec.validate import Resolved, Validation

MAX_MESSAGE = 1024


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw (children after its own applies) and did."""

    children: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)
    foreign: list[dict] = field(default_factory=list)
    blocked: list[dict] = field(default_factory=list)
    rollout: Rollout | None = None
    """The rollout's plan and clock (controller/rollout.py; None: not computed)."""
    restarts: list[Decision] = field(default_factory=list)
    """Group-restart decisions other than `none` made in this pass."""
    links: list[dict] | None = None
    """status.kvLinks as controller/links.py computed it (None: not computed, keep the previous)."""
    unserved: dict | None = None
    """A child whose kind the API server does not serve (the apply stopped there), with `error`."""
    unserved_error: str = ""
    scaling: Bounded | None = None
    """The roles' requested and effective instance counts (None: every role runs its spec's count)."""
    draining: list[dict] | None = None
    """status.draining as controller/drain.py made it (None: not computed, keep the previous)."""
    routable: Routable | None = None
    """The instances the proxy's membership lists, as written (controller/gate.py)."""
    figures: Figures | None = None
    """Each role's revision, instances updated and Ready over `pods` (controller/rollout.py
    figures); given whenever the spec is valid."""
    sizes: Sizes | None = None
    """The pods each instance runs when whole (controller/revisions.py; None: the spec's shape)."""
    refused: Validation | None = None
    """The spec's own validation when it was refused and the children follow the last valid spec
    (controller/last_valid.py), which the validation passed with the status is."""


@dataclass(frozen=True)
class _Cond:
    type: str
    ok: bool | None
    reason: str
    message: str


def _errors_text(findings: list[Finding]) -> str:
    return " ".join(f"{f.path}: {f.message}" if f.path else f.message for f in findings)[:MAX_MESSAGE]


def _child(observed: Observed, kind: str, name: str) -> dict | None:
    return next((child for child in observed.children
                 if child["kind"] == kind and child["metadata"]["name"] == name), None)


def shape(dep: PDDeployment, role: str) -> str:
    """`1xTP8`, `2xDP2xTP4`, `1xTP8xPP2`: instances x DP x TP (x PP)."""
    spec = dep.role(role)
    parts = [f"{spec.replicas}"]
    if spec.data_parallel_size > 1:
        parts.append(f"DP{spec.data_parallel_size}")
    parts.append(f"TP{spec.tensor_parallel_size}")
    if spec.pipeline_parallel_size > 1:
        parts.append(f"PP{spec.pipeline_parallel_size}")
    return "x".join(parts)


def _figures(observed: Observed) -> Figures:
    if observed.figures is None:
        raise ValueError("Observed.figures is required with a valid spec (controller/rollout.py figures)")
    return observed.figures


def image_report(pods: list[dict]) -> str | None:
    """What the pd-image-report init container of the instance's leader pod (the lowest ordinal it
    has) reported of its image (serving_image/installed.py `read_report`); None: nothing yet."""
    if not pods:
        return None
    for status in (_leader(pods).get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") == tools.REPORT_CONTAINER:
            for state in (status.get("state"), status.get("lastState")):
                found = read_report(((state or {}).get("terminated") or {}).get("message"))
                if found is not None:
                    return found
    return None


def _leader(pods: list[dict]) -> dict:
    """The pod of the lowest ordinal."""
    return min(pods, key=lambda p: int(i) if (i := label(p, POD_INDEX) or "").isdigit() else 0)


def tools_of(pods: list[dict]) -> str | None:
    """The operator image the instance's leader pod takes its tools from (its pd-tools init container)."""
    if not pods:
        return None
    containers = (_leader(pods).get("spec") or {}).get("initContainers") or []
    return next((c.get("image") for c in containers if c.get("name") == tools.INIT_CONTAINER), None)


def instance_statuses(resolved: Resolved, role: str, pods: list[dict], sizes: Sizes | None = None
                      ) -> list[InstanceStatus]:
    """Every instance of the role with pods: its revision, whether it is Ready, the tools it runs and
    the vllm-ascend its image reported."""
    return [InstanceStatus(name=resolved.names.instance(role, index), revision=revision_of(members),
                           ready=instance_ready(members, expected_pods(resolved, sizes, role, index)),
                           tools=tools_of(members),
                           vllm_ascend=image_report(members))
            for (of_role, index), members in sorted(by_instance(pods).items()) if of_role == role]


def _tools_condition(resolved: Resolved, observed: Observed) -> _Cond:
    older = sorted(f"{resolved.names.instance(role, index)} ({image})"
                   for (role, index), members in by_instance(observed.pods).items()
                   if (image := tools_of(members)) is not None and image != resolved.tools_image)
    if not older:
        return _Cond(c.TOOLS_CURRENT, True, c.OPERATOR_TOOLS,
                     f"Every instance runs the tools of the operator's image {resolved.tools_image}.")
    return _Cond(c.TOOLS_CURRENT, False, c.OLDER_TOOLS,
                 f"{', '.join(older)} run the tools of an older operator image than "
                 f"{resolved.tools_image}: kept so that the operator's upgrade restarts no engine. They "
                 "take the new tools with their role's next template change; set "
                 "spec.image.toolsUpdate: WithOperator to roll them now.")


def _kv_condition(validation: Validation) -> _Cond:
    report = validation.report
    if report is None:
        errors = validation.errors
        reason = errors[0].code if errors else c.LAYOUT_UNRESOLVED
        return _Cond(c.KV_COMPATIBLE, False, reason,
                     _errors_text(errors) or "The model's KV description could not be resolved.")
    errors = [f for f in report.findings if f.severity == "error"]
    if errors:
        return _Cond(c.KV_COMPATIBLE, False, errors[0].code, _errors_text(errors))
    p, d = report.prefill_layout, report.decode_layout
    if p is None or d is None:  # check_pair leaves a layout out only beside an error finding
        return _Cond(c.KV_COMPATIBLE, False, c.LAYOUT_UNRESOLVED,
                     "The KV layout of a role could not be resolved.")
    return _Cond(c.KV_COMPATIBLE, True, c.COMPATIBLE,
                 f"Prefill engine blocks of {p.engine_block_size} tokens and decode blocks of "
                 f"{d.engine_block_size} tokens pair through {report.segment_tokens}-token segments.")


def _unlinked(resolved: Resolved, pods: list[dict]) -> list[str]:
    """Decode instances with a pod whose KV-link gate does not pass."""
    groups = by_instance(pods)
    return [resolved.names.instance("decode", i) for i in range(resolved.role("decode").replicas)
            if any(not link_ready(p) for p in groups.get(("decode", i), []))]


def _role_condition(resolved: Resolved, role: str, ready: int, pods: list[dict]) -> _Cond:
    kind = c.ROLE_READY[role]
    want = resolved.role(role).replicas
    if want == 0:
        return _Cond(kind, True, c.SCALED_TO_ZERO, f"The {role} role runs no instances.")
    if ready >= want:
        return _Cond(kind, True, c.INSTANCES_READY, f"All {want} {role} instances are ready.")
    pending = sorted((p["metadata"]["name"], why) for (of_role, _), group in by_instance(pods).items()
                     if of_role == role for p in group if (why := unschedulable(p)))
    if pending:
        name, why = pending[0]
        more = f" (and {len(pending) - 1} more pods)" if len(pending) > 1 else ""
        return _Cond(kind, False, c.UNSCHEDULABLE,
                     f"{ready} of {want} {role} instances are ready; pod {name}{more} cannot be "
                     f"scheduled: {why}")
    unlinked = _unlinked(resolved, pods) if role == "decode" else []
    if unlinked:
        return _Cond(kind, False, c.KV_LINK_NOT_READY,
                     f"{ready} of {want} decode instances are ready; {', '.join(unlinked)} cannot yet (or no "
                     "longer) pull KV from every prefill instance, so the proxy does not route to them. "
                     "See status.kvLinks and the kv-link container's log.")
    return _Cond(kind, False, c.INSTANCES_NOT_READY,
                 f"{ready} of {want} {role} instances are ready; the others are starting or loading "
                 "the model (see the pods' events).")


def _deployment_ready(obj: dict | None) -> tuple[int, int]:
    """(ready replicas, wanted replicas) of an observed Deployment."""
    if obj is None:
        return 0, 1
    return (obj.get("status") or {}).get("readyReplicas") or 0, (obj.get("spec") or {}).get("replicas", 1)


def _proxy_condition(resolved: Resolved, observed: Observed) -> _Cond:
    if not resolved.deployment.spec.proxy.enabled:
        return _Cond(c.PROXY_READY, True, c.PROXY_DISABLED, "spec.proxy.enabled is false.")
    listed = observed.routable
    if listed is not None and (missing := [role for role in ROLES if not listed[role]]):
        return _Cond(c.PROXY_READY, False, c.NO_UPSTREAMS,
                     f"The proxy has no {' and no '.join(missing)} instance it may route to yet (an instance "
                     "joins once all its pods are Ready, a decode instance once its KV link works too); "
                     "it answers 503 until it has.")
    ready, want = _deployment_ready(_child(observed, "Deployment", resolved.names.proxy))
    if ready >= want:
        return _Cond(c.PROXY_READY, True, c.PROXY_AVAILABLE, f"{ready} proxy pods are ready.")
    return _Cond(c.PROXY_READY, False, c.PROXY_NOT_READY, f"{ready} of {want} proxy pods are ready.")


def _degraded(observed: Observed) -> _Cond:
    limited = [d for d in observed.restarts if d.action == "limited"]
    if limited:
        names = ", ".join(d.instance for d in limited)
        return _Cond(c.DEGRADED, True, c.GROUP_RESTART_LIMITED,
                     f"Instances {names} keep failing; group restarts stopped after the limit. Check "
                     "the pods' logs, fix the cause, then delete the pods to retry.")
    restarted = [d for d in observed.restarts if d.action == "restart"]
    if restarted:
        return _Cond(c.DEGRADED, True, c.GROUP_RESTART,
                     f"Restarted all pods of {', '.join(d.instance for d in restarted)} after "
                     f"{', '.join(p for d in restarted for p in d.failed)} failed: the other ranks "
                     "of an engine cannot recover alone.")
    if observed.blocked:
        names = ", ".join(f"{m['kind']} {m['metadata']['name']}" for m in observed.blocked)
        return _Cond(c.DEGRADED, True, c.NAME_CONFLICT,
                     f"{names} already exist(s) without this PDDeployment as owner; delete or rename "
                     "them so the operator can create its own.")
    if observed.foreign:
        names = ", ".join(f"{m['kind']} {m['metadata']['name']}" for m in observed.foreign)
        return _Cond(c.DEGRADED, True, c.FOREIGN_CHILD,
                     f"{names} carry this PDDeployment's labels but are not owned by it; they are "
                     "left alone. Remove the labels or the objects.")
    return _Cond(c.DEGRADED, False, c.AS_EXPECTED, "Nothing is degraded.")


def _gang_sizes(resolved: Resolved, observed: Observed) -> list[tuple[str, int, str]]:
    """(role, pods per instance, its instances' names or "" when the whole role has that count) of
    every instance the rollout runs: mid-rollout an instance not moved yet keeps its own revision's
    count (observed.sizes), so a role may have two."""
    members = observed.rollout.plan.instances if observed.rollout is not None else {
        role: range(resolved.role(role).replicas) for role in ROLES}
    out: list[tuple[str, int, str]] = []
    for role in ROLES:
        by_count: dict[int, list[str]] = {}
        for index in sorted(members[role]):
            by_count.setdefault(expected_pods(resolved, observed.sizes, role, index), []).append(
                resolved.names.instance(role, index))
        out += [(role, pods, ", ".join(names) if len(by_count) > 1 else "")
                for pods, names in sorted(by_count.items())]
    return out


def _gang_condition(resolved: Resolved, observed: Observed) -> _Cond:
    dep = resolved.deployment
    gang = dep.spec.scheduling.gang
    if observed.unserved is not None and observed.unserved.get("kind") == "PodGroup":
        api = observed.unserved["apiVersion"]
        return _Cond(c.GANG_SCHEDULING, False, c.GANG_UNAVAILABLE,
                     f"spec.scheduling.gang {gang} needs {api} PodGroups, which this cluster does not "
                     f"serve ({observed.unserved_error}); it needs {scheduling.NEEDS.get(api, api)}. The "
                     "instances' StatefulSets are not applied until then; or set spec.scheduling.gang "
                     "to none.")
    sizes = _gang_sizes(resolved, observed)
    if gang == "none":
        multi = [(role, pods, names) for role, pods, names in sizes if pods > 1]
        if not multi:
            return _Cond(c.GANG_SCHEDULING, True, c.SINGLE_POD_INSTANCES,
                         "Every instance is one pod: none can be placed in part.")
        roles = " and ".join(f"{role} instances ({pods} pods each{': ' + names if names else ''})"
                             for role, pods, names in multi)
        return _Cond(c.GANG_SCHEDULING, False, c.PARTIAL_PLACEMENT_POSSIBLE,
                     f"The pods of {roles} are scheduled one by one (spec.scheduling.gang is none): an "
                     "instance can be placed in part, holding NPUs while its other pods wait. Set "
                     "spec.scheduling.gang to volcano or kubernetes to place each instance whole.")
    if dep.spec.placement.gang_topology:
        # The spec's groups only: one an instance not moved yet keeps (controller/revisions.py pin)
        # may be of a revision from before gangTopology, rendered without the constraint.
        ours = {scheduling.pod_group_name(resolved, role, i) for role, i in resolved.instances()}
        dropped = sorted(group["metadata"]["name"] for group in observed.children
                         if group["kind"] == "PodGroup" and group["apiVersion"] == scheduling.KUBE_API
                         and group["metadata"]["name"] in ours
                         and not (group.get("spec") or {}).get("schedulingConstraints"))
        if dropped:
            return _Cond(c.GANG_SCHEDULING, False, c.GANG_UNAVAILABLE,
                         f"kube-apiserver dropped the topology constraint of PodGroup {', '.join(dropped)}: "
                         f"enable the {scheduling.TOPOLOGY_GATE} feature gate on kube-apiserver and "
                         "kube-scheduler, or set spec.placement.gangTopology to false.")
    which = "Volcano" if gang == "volcano" else "kube-scheduler"
    counts = ", ".join(f"{role} {pods}{f' ({names})' if names else ''}" for role, pods, names in sizes)
    return _Cond(c.GANG_SCHEDULING, True, c.POD_GROUPS,
                 f"Each instance is one {which} PodGroup of all its pods ({counts or 'no instances'}): the "
                 "scheduler binds all of an instance's pods or none.")


def _scaling_condition(resolved: Resolved, observed: Observed) -> _Cond:
    holds = observed.scaling.holds if observed.scaling is not None else []
    if not holds:
        return _Cond(c.SCALING_LIMITED, False, c.WITHIN_BOUNDS,
                     "Each role runs the instances its PDRole asks for.")
    return _Cond(c.SCALING_LIMITED, True, holds[0].bound,
                 " ".join(f"PDRole {resolved.names.role(h.role)}: {h.message()}" for h in holds))


def _refused(refused: Validation) -> list[_Cond]:
    """Ready and Progressing while a refused spec waits and the last valid one runs."""
    return [_Cond(c.READY, False, refused.errors[0].code if refused.errors else c.INVALID_SPEC,
                  "The spec is invalid; the instances keep running, gated and drained, on the last valid "
                  f"spec. {_errors_text(refused.errors)}"),
            _Cond(c.PROGRESSING, False, c.INVALID_SPEC, "Fix the spec to continue.")]


def _summary(validation: Validation, parts: list[_Cond], observed: Observed) -> list[_Cond]:
    if observed.refused is not None:
        return _refused(observed.refused)
    if validation.resolved is None:
        text = _errors_text(validation.errors)
        return [_Cond(c.READY, False, validation.errors[0].code if validation.errors else c.INVALID_SPEC,
                      f"The spec is invalid; the children of the last valid spec are unchanged. {text}"),
                _Cond(c.PROGRESSING, False, c.INVALID_SPEC, "Fix the spec to continue.")]
    failing = [cond for cond in parts if cond.ok is not True]
    if not failing:
        ready = _Cond(c.READY, True, c.SERVING, "Prefill, decode and the proxy are ready.")
    else:
        ready = _Cond(c.READY, False, failing[0].reason, failing[0].message)
    moving = _rollout_condition(validation.resolved, observed.rollout, observed.pods)
    if moving is not None:
        progressing = moving
    elif failing:
        progressing = _Cond(c.PROGRESSING, True, c.WAITING_FOR_PODS, failing[0].message)
    elif held := _held_by_partition(validation.resolved, observed.rollout):
        progressing = _Cond(c.PROGRESSING, False, c.ROLLOUT_PARTITIONED,
                            f"The partition holds {', '.join(held)} on an older template; every instance "
                            "above it is up to date and ready. Lower spec.<role>.rollout.partition to "
                            "move them.")
    else:
        progressing = _Cond(c.PROGRESSING, False, c.COMPLETE, "Every child is up to date and ready.")
    return [ready, progressing]


def _held_by_partition(resolved: Resolved, moving: Rollout | None) -> list[str]:
    """Instances below their role's partition not on the current template: a held canary is not
    Complete."""
    if moving is None:
        return []
    return [resolved.names.instance(role, i) for role in ROLES for i, s in sorted(moving.state[role].items())
            if i < min(moving.params[role].partition, moving.params[role].replicas) and not s.updated]


def _unschedulable_surge(moving: Rollout, pods: list[dict]) -> list[tuple[str, str, str]]:
    """(role, pod, the scheduler's message) of each pod of a surge instance that cannot be
    scheduled."""
    surge = {(role, i) for role in ROLES for i in moving.plan.instances[role]
             if i >= moving.params[role].replicas}
    return sorted((role, p["metadata"]["name"], why) for (role, index), group in by_instance(pods).items()
                  if (role, index) in surge for p in group if (why := unschedulable(p)))


def _rollout_condition(resolved: Resolved, moving: Rollout | None, pods: list[dict]) -> _Cond | None:
    """Progressing while a rollout is under way (None: none is)."""
    if moving is None or moving.since is None:
        return None
    plan, params = moving.plan, moving.params
    counts = ", ".join(f"{role} {params[role].replicas - plan.outdated[role]} of {params[role].replicas}"
                       for role in ROLES)
    halted = [role for role in ROLES if params[role].halted]
    if halted:
        stuck = [resolved.names.instance(role, i) for role in ROLES for i, s in moving.state[role].items()
                 if s.updated and not s.ready]
        return _Cond(c.PROGRESSING, False, c.PROGRESS_DEADLINE_EXCEEDED,
                     f"No {' or '.join(halted)} instance was replaced or became Ready on the new template "
                     f"within {min(moving.deadline[r] for r in halted)} s (instances updated: {counts}); "
                     f"the rollout stopped{' at ' + ', '.join(stuck) if stuck else ''} and the other "
                     "instances keep serving. Fix the template (see those pods' events and logs); "
                     "applying the previous spec again rolls back only what moved.")
    if plan.blocked:
        return _Cond(c.PROGRESSING, False, c.ROLLOUT_BLOCKED, plan.blocked)
    paused = [role for role in ROLES if params[role].paused and plan.outdated[role]]
    if paused and not plan.leave:
        return _Cond(c.PROGRESSING, None, c.ROLLOUT_PAUSED,
                     f"spec.{' and spec.'.join(paused)}.rollout.paused is true (instances updated: "
                     f"{counts}). Set it to false to continue.")
    pending = _unschedulable_surge(moving, pods)
    if pending and not plan.leave:
        role, pod, why = pending[0]
        roles = sorted({r for r, _, _ in pending})
        fields = " and ".join(f"spec.{r}.rollout" for r in roles)
        return _Cond(c.PROGRESSING, False, c.SURGE_UNSCHEDULABLE,
                     f"Surge pod {pod}{f' (and {len(pending) - 1} more)' if len(pending) > 1 else ''} "
                     f"cannot be scheduled: {why}; no outdated instance leaves until a surge instance "
                     f"serves in its place (instances updated: {counts}). Free NPUs for it, or set "
                     f"{fields} to maxSurge 0 and maxUnavailable 1 to replace instances in place (a role of "
                     "one instance then serves nothing while its instance is replaced).")
    leaving = ", ".join(resolved.names.instance(role, i) for role, i in sorted(plan.leave))
    surge = ", ".join(resolved.names.instance(role, i) for role, i in surplus(params, moving.state))
    return _Cond(c.PROGRESSING, True, c.ROLLOUT_IN_PROGRESS,
                 f"Rolling out a new pod template; instances updated: {counts}"
                 f"{'; replacing ' + leaving if leaving else ''}"
                 f"{'; surge instances running: ' + surge if surge else ''}.")


def _evaluate(validation: Validation, observed: Observed) -> list[_Cond]:
    resolved = validation.resolved
    kv = _kv_condition(observed.refused or validation)
    if resolved is None:
        return [kv, *_summary(validation, [], observed), _degraded(observed)]
    figures = _figures(observed)
    parts = [_role_condition(resolved, role, figures[role].ready, observed.pods) for role in ROLES]
    parts.append(_proxy_condition(resolved, observed))
    gang = _gang_condition(resolved, observed)
    # Only a PodGroup kind the cluster lacks stops the apply (and so the instances); the other
    # GangScheduling states are advice.
    blocking = [gang] if observed.unserved is not None and gang.reason == c.GANG_UNAVAILABLE else []
    return [kv, *parts, *_summary(validation, [*blocking, *parts], observed), _degraded(observed), gang,
            _scaling_condition(resolved, observed), _tools_condition(resolved, observed)]


def _status_word(ok: bool | None) -> Literal["True", "False", "Unknown"]:
    return "Unknown" if ok is None else "True" if ok else "False"


def conditions(validation: Validation, observed: Observed, previous: list[dict], generation: int | None,
               now: str) -> list[dict]:
    """The conditions, in TYPES order; lastTransitionTime kept from `previous` unless status changed."""
    before = {old.get("type"): old for old in previous}
    out = []
    for cond in sorted(_evaluate(validation, observed), key=lambda cond: c.TYPES.index(cond.type)):
        status = _status_word(cond.ok)
        prior = before.get(cond.type)
        since = prior.get("lastTransitionTime") if prior and prior.get("status") == status else None
        out.append(Condition(type=cond.type, status=status, reason=cond.reason,
                             message=cond.message[:MAX_MESSAGE], observed_generation=generation,
                             last_transition_time=since or now).to_wire())
    return out


def _role_status(resolved: Resolved, role: str, figures: RoleFigures, observed: Observed) -> RoleStatus:
    dep = resolved.deployment
    return RoleStatus(desired_instances=dep.role(role).replicas, ready_instances=figures.ready,
                      updated_instances=figures.updated, revision=figures.revision, shape=shape(dep, role),
                      instances=instance_statuses(resolved, role, observed.pods, observed.sizes) or None)


def _previous(previous: dict) -> PDDeploymentStatus:
    """The previous status as the model reads it, to keep what this pass does not compute. A field
    this version cannot read (another version of the operator wrote it) is not kept."""
    readable = {}
    for name, info in PDDeploymentStatus.model_fields.items():
        key = info.alias or name
        if key in previous:
            try:
                PDDeploymentStatus.model_validate({key: previous[key]})
            except ValidationError:
                continue
            readable[key] = previous[key]
    return PDDeploymentStatus.model_validate(readable)


def status(validation: Validation, observed: Observed, previous: dict, generation: int | None,
           now: str) -> dict:
    """The whole `.status`, through its model (api/types.py PDDeploymentStatus). With an invalid spec
    the last valid layout and role figures are kept."""
    before = _previous(previous)
    conds = [Condition.model_validate(cond) for cond in
             conditions(validation, observed, previous.get("conditions") or [], generation, now)]
    resolved = validation.resolved
    if resolved is None:
        return PDDeploymentStatus.model_validate(
            {**before.model_dump(), "observed_generation": generation, "conditions": conds}).to_wire()
    dep = resolved.deployment
    figures = _figures(observed)
    segment = resolved.report.segment_tokens
    assert segment is not None, "a Resolved has both KV layouts"
    since = observed.rollout.since if observed.rollout is not None else None
    progress = (before.rollout_progress_time if observed.rollout is None
                else since.strftime("%Y-%m-%dT%H:%M:%SZ") if since is not None else None)
    links = (before.kv_links if observed.links is None
             else [KVLinkStatus.model_validate(link) for link in observed.links])
    draining = (before.draining if observed.draining is None
                else [DrainingStatus.model_validate(d) for d in observed.draining] or None)
    return PDDeploymentStatus(
        observed_generation=generation, conditions=conds,
        prefill=_role_status(resolved, "prefill", figures["prefill"], observed),
        decode=_role_status(resolved, "decode", figures["decode"], observed),
        kv_layout=KVLayoutStatus(prefill_block_size=resolved.engine_block_size("prefill"),
                                 decode_block_size=resolved.engine_block_size("decode"),
                                 segment_tokens=segment, hash=resolved.layout_hash,
                                 prefill_prefix_hit_tokens=resolved.prefix_hit_tokens("prefill"),
                                 decode_prefix_hit_tokens=resolved.prefix_hit_tokens("decode")),
        kv_links=links, draining=draining, rollout_progress_time=progress,
        proxy_endpoint=(f"{dep.name}-proxy.{dep.namespace}.svc:{dep.spec.proxy.port}"
                        if dep.spec.proxy.enabled else None)).to_wire()


def merge_patch(previous: dict, new: dict) -> dict:
    """The JSON merge patch (RFC 7396) that turns status `previous` into `new`: a key `new` no longer
    has is sent as null, since a key merely missing from a merge patch keeps its stored value (a
    drained instance would stay in status.draining). Objects merge key by key, so the same holds inside
    them (status.kvLayout.prefillPrefixHitTokens goes when prefill stops caching prefixes)."""
    out = dict(new)
    for key, before in previous.items():
        if key not in new:
            out[key] = None
        elif isinstance(before, dict) and isinstance(new[key], dict):
            out[key] = merge_patch(before, new[key])
    return out


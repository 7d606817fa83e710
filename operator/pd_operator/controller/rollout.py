"""The rollout planner: which instances leave the proxy to be replaced by the new pod template, and
how many extra instances run meanwhile. Pure: it takes what the reconcile observed and returns
the next step; the reconcile drains, deletes pods and writes the membership.

Why a planner: each instance is its own StatefulSet, updated `OnDelete` (render/workloads.py), and
keeps its own revision until the planner moves it (controller/revisions.py pin), so a new template
reaches a running engine only when the operator replaces its pods. Deleting them all
at once is an outage per deploy (every engine reloads its weights), so instances move a few at a
time, by the same path as a scale-down: out of the membership, drained (controller/drain.py), pods
deleted, back in once every pod is Ready on the new template (decode: once its KV link passes;
controller/gate.py). The model is the planner of kubernetes-sigs/lws
(pkg/controllers/disaggregatedset/ @ main): numbers and the next step from observed state, and an
exhaustive walk over small shapes in its tests (tests/controller/test_rollout_walk.py).

The rule, per role (`spec.<role>.rollout`, named as Deployments and StatefulSets name them):
- up to `maxSurge` extra instances (ordinals from `replicas` on) run the new template while
  outdated instances remain, and leave (drained, as a scale-down) when none does; of the instances
  past `replicas` (surge ones, or ones a scale-down left there), one on the current revision stays
  before an outdated one, a Ready one before one loading (a scale-down mid-surge removes the old
  instance, not the new one it would have to replace again);
- an outdated instance at or above `partition` may leave when, after it left, its role keeps
  `replicas - maxUnavailable` instances available (`available`: all but the leaving, the missing
  and the new ones still loading; one budget, as a Deployment's), and every role still has at least
  `replicas - maxUnavailable` instances serving, or no fewer than before. An
  instance serves when it is Ready, not leaving, and the other role has a serving candidate on its
  KV layout: a new image or block size gives new instances another kv-layout hash, and the proxy
  pairs prefill and decode only within one layout (proxy/membership.py), so an old prefill whose
  old decodes are all gone serves nothing. Counting that keeps a compatible pair serving through a
  layout change, or holds the rollout (`blocked`) when no order can, saying what to raise.
- no step takes the serving prefill:decode ratio outside spec.scaling.ratio (or further outside):
  where one instance leaving alone would, instances of the other role leave along with it, within
  their own budget;
- the last instance of an old KV layout stays while the other role's partition holds instances on
  that layout (partitions may differ per role): they would serve nothing without it;
- instances not Ready leave first (they serve nothing), within that budget; then the role further
  behind, highest ordinal first (as a StatefulSet rolls).
- `paused`, or a passed progress deadline (`halted`), takes no further instance out; those already
  leaving finish.

The clock (`step`): the progress deadline counts from the last change of the roles' figures (their
revision, instances updated, instances Ready; `figures`, computed once per reconcile from the
revisions of render/workloads.py Templates) or other progress (`_moved`: an instance Ready, a surge
one too, or drained; a spec change; the end of a pause or block), kept in
status.rolloutProgressTime, as a Deployment's progressDeadlineSeconds counts. It stands still while
the rollout is paused or blocked; a passed deadline stops further steps until something moves.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from pd_operator.api import conditions as c
from pd_operator.api.labels import REVISION
from pd_operator.api.types import ROLES as _ROLES
from pd_operator.api.types import RatioBounds
from pd_operator.controller import drain
from pd_operator.controller.pods import by_instance, instance_ready, label
from pd_operator.controller.revisions import Sizes, expected_pods
from pd_operator.spec.scaling import ratio_excess
from pd_operator.spec.validate import Resolved

ROLES: tuple[str, ...] = _ROLES

Key = tuple[str, int]
"""(role, index)."""


def other(role: str) -> str:
    return "decode" if role == "prefill" else "prefill"


@dataclass(frozen=True)
class InstanceState:
    updated: bool
    """Every pod it has runs the role's current revision (none yet: it is created from it)."""
    ready: bool
    """All its pods are Ready (decode: and its KV link passes): the proxy may list it."""
    layout: str
    """The kv-layout its pods pair as (render/workloads.py Templates.paired): the hash they run but
    after a decode-only block-size change, when decode's new hash pairs as prefill's."""
    leaving: bool = False
    """It left the membership to be replaced and drains (status.draining)."""
    label: str | None = None
    """The kv-layout hash its pods run when it is not `layout` (None: `layout`): the membership lists
    them by it, as their gates know it."""


@dataclass(frozen=True)
class RoleParams:
    replicas: int
    max_unavailable: int
    max_surge: int
    partition: int = 0
    paused: bool = False
    halted: bool = False
    """The progress deadline passed."""

    @property
    def minimum(self) -> int:
        """Instances that must keep serving."""
        return max(0, self.replicas - self.max_unavailable)

    @property
    def moving(self) -> bool:
        return not (self.paused or self.halted)


def params_of(resolved: Resolved, halted: Collection[str] = ()) -> dict[str, RoleParams]:
    """Each role's parameters from its spec (spec.<role>.replicas as run, spec.<role>.rollout);
    `halted`: roles whose progress deadline passed."""
    out = {}
    for role in ROLES:
        spec = resolved.role(role)
        r = spec.rollout
        out[role] = RoleParams(spec.replicas, r.max_unavailable, r.max_surge, r.partition, r.paused,
                               role in halted)
    return out


Members = Mapping[str, Collection[int]]
"""Per role: the indices of the instances a plan runs (Plan.instances)."""

State = Mapping[str, Mapping[int, InstanceState]]
"""Per role, per index: every instance that exists (surge ones from `replicas` on). An index below
`replicas` without an entry is an instance still to be created (from the current template)."""


@dataclass(frozen=True)
class Plan:
    leave: frozenset[Key]
    """Instances out of the membership that drain, then have their pods replaced: those already
    leaving and those this step adds."""
    instances: dict[str, frozenset[int]]
    """Per role: the indices of the instances to run (the spec's, plus surge ones past them)."""
    serving: dict[str, int]
    """Per role: instances serving once `leave` left."""
    outdated: dict[str, int]
    """Per role: instances at or above the partition not on the current revision yet."""
    blocked: str | None = None
    """Why no outdated instance can move although nothing is in progress (what to change)."""

    def routable(self, state: State) -> dict[str, dict[int, str]]:
        """What the proxy may list: Ready instances that stay, by index, with their kv-layout hash."""
        return {role: {i: s.label or s.layout for i, s in state.get(role, {}).items()
                       if s.ready and (role, i) not in self.leave and i in self.instances[role]}
                for role in ROLES}

    @property
    def complete(self) -> bool:
        return not any(self.outdated.values()) and not self.leave


@dataclass(frozen=True)
class Rollout:
    """The rollout as this reconcile sees it: the plan, what it was made from, and its clock."""

    plan: Plan
    state: dict[str, dict[int, InstanceState]]
    params: dict[str, RoleParams]
    since: datetime | None
    """When it last progressed (None: no rollout under way)."""
    deadline: dict[str, int]
    """Per role: spec.<role>.rollout.progressDeadlineSeconds as it applies."""

    def recheck_after(self, now: datetime) -> float | None:
        """Seconds until a role's progress deadline passes, to look again then (None: no rollout
        is under way, or every deadline passed)."""
        if self.since is None:
            return None
        left = min(self.deadline[role] - (now - self.since).total_seconds() for role in ROLES)
        return left + 1 if left > 0 else None


def serving(state: State, members: Members, leave: frozenset[Key]) -> dict[str, int]:
    """Per role: instances that are Ready, stay, and have a partner of the other role on their
    layout."""
    up = {role: {i: s.layout for i, s in state.get(role, {}).items()
                 if s.ready and i in members[role] and (role, i) not in leave}
          for role in ROLES}
    return {role: sum(1 for layout in up[role].values() if layout in set(up[other(role)].values()))
            for role in ROLES}


def available(state: State, members: Members, leave: frozenset[Key], role: str) -> int:
    """Instances of `role` that serve or may again without the rollout's help: every one that
    stays except a new one still loading (an outdated one that lost readiness may regain it, a
    blip). What the unavailability budget counts, as a Deployment's rolling update counts its pods
    (kubernetes: pkg/controller/deployment/rolling.go @ v1.36.3, cleanupUnhealthyReplicas): taking
    out an un-Ready outdated instance spends the budget like a Ready one, so a readiness blip
    replaces at most maxUnavailable (plus surge) instances at once, not all of them."""
    return sum(1 for i, s in state.get(role, {}).items()
               if i in members[role] and (role, i) not in leave and (s.ready or not s.updated))


def _members(params: RoleParams, instances: Mapping[int, InstanceState], surge: int) -> frozenset[int]:
    """The indices to run: the spec's, and `surge` past them. Of those running past `replicas`, one on
    the current revision stays before an outdated one (a scale-down mid-surge left it there: it
    would have to be replaced again), a Ready one before one loading, as a ReplicaSet's scale-down
    deletes un-Ready pods first (kubernetes: pkg/controller/controller_utils.go @ v1.36.3,
    ActivePods); then new indices from `replicas` on."""
    past = sorted((i for i in instances if i >= params.replicas),
                  key=lambda i: (not instances[i].updated, not instances[i].ready, i))[:surge]
    free = (i for i in itertools.count(params.replicas) if i not in instances)
    return frozenset(range(params.replicas)) | frozenset(past) | frozenset(
        itertools.islice(free, surge - len(past)))


def surplus(params: Mapping[str, RoleParams], state: State) -> list[Key]:
    """Instances past a role's replicas (surge instances, or ones a scale-down removes), in order."""
    return [(role, i) for role in ROLES for i in sorted(state.get(role, {})) if i >= params[role].replicas]


def _outdated(params: RoleParams, instances: Mapping[int, InstanceState]) -> list[int]:
    return [i for i in range(params.partition, params.replicas)
            if i in instances and not instances[i].updated]


def _surge(params: RoleParams, instances: Mapping[int, InstanceState], outdated: int) -> int:
    """Extra instances to run: while outdated ones remain (and it moves), up to maxSurge; after that
    (or paused) only those already running, while an instance they stand in for is not Ready yet,
    so their leaving never takes serving below what it was."""
    running = sum(1 for i in instances if i >= params.replicas)
    need = outdated + sum(1 for i in range(params.replicas) if i not in instances or not instances[i].ready)
    if outdated and params.moving:
        return min(params.max_surge, need)
    return min(running, params.max_surge, need)


def _stranded(params: Mapping[str, RoleParams], state: State, layout: str) -> list[str]:
    """Roles whose new instances would run a KV layout (`layout`, the current template's) that no
    instance of the other role runs or will run: its partition keeps all of it on an old one."""
    return [role for role in ROLES
            if params[other(role)].partition >= params[other(role)].replicas
            and all(s.layout != layout for s in state.get(other(role), {}).values())]


def _held_layouts(params: Mapping[str, RoleParams], state: State, layout: str) -> dict[str, set[str]]:
    """Per role: the old KV layouts its partition holds instances on (below it, not updated)."""
    return {role: {s.layout for i, s in state.get(role, {}).items()
                   if i < min(params[role].partition, params[role].replicas) and not s.updated
                   and s.layout != layout}
            for role in ROLES}


def _partners_kept(state: State, members: Members, held: Mapping[str, set[str]],
                   before: frozenset[Key], after: frozenset[Key]) -> bool:
    """Whether every old layout a partition holds instances on keeps an instance of the other role
    that `before` kept: else the held instances would stay, on their old template, pairing with
    nothing (partitions may differ per role)."""
    def kept(role: str, layout: str, leave: frozenset[Key]) -> bool:
        return any(s.layout == layout and i in members[role] and (role, i) not in leave
                   for i, s in state.get(role, {}).items())
    return all(kept(other(role), old, after) or not kept(other(role), old, before)
               for role in ROLES for old in held[role])


REFUSED_BY_PARTITION = "partition"
REFUSED_BY_RATIO = "ratio"


def plan(params: Mapping[str, RoleParams], state: State, layout: str, ratio: RatioBounds | None = None
         ) -> Plan:
    """The next step. `layout`: the kv-layout hash of the current template; `ratio`:
    spec.scaling.ratio, which no step takes the serving counts outside of (or further outside)."""
    ratio = ratio or RatioBounds()
    outdated = {role: _outdated(params[role], state.get(role, {})) for role in ROLES}
    stranded = _stranded(params, state, layout)
    held = _held_layouts(params, state, layout)
    # A stranded role starts no surge: a new instance would pair with nothing.
    members = {role: _members(params[role], state.get(role, {}),
                              _surge(params[role], state.get(role, {}),
                                     0 if role in stranded else len(outdated[role])))
               for role in ROLES}
    leave = frozenset((role, i) for role in ROLES for i in outdated[role] if state[role][i].leaving)
    now = serving(state, members, leave)

    def refusal(group: frozenset[Key]) -> str | None:
        """Why `group` may not leave on top of `leave` (None: it may)."""
        trial = leave | group
        after = serving(state, members, trial)
        if any(available(state, members, trial, role) < params[role].minimum for role, _ in group):
            return "budget"
        if not all(after[r] >= now[r] or after[r] >= params[r].minimum for r in ROLES):
            return "serving"
        if not _partners_kept(state, members, held, leave, trial):
            return REFUSED_BY_PARTITION
        if ratio_excess(after["prefill"], after["decode"], ratio) > \
                ratio_excess(now["prefill"], now["decode"], ratio):
            return REFUSED_BY_RATIO
        return None

    def order(key: Key) -> tuple:
        role, index = key
        done = params[role].replicas - len(outdated[role])
        return (state[role][index].ready, done / max(params[role].replicas, 1), -index, role)

    candidates = sorted(((role, i) for role in ROLES if params[role].moving and role not in stranded
                         for i in outdated[role] if (role, i) not in leave), key=order)
    refused: set[str] = set()
    for key in candidates:  # each accepted group lowers `now` only where it stays above the minimum
        if key in leave:
            continue
        group = frozenset({key})
        why = refusal(group)
        # A step that would break the ratio alone may keep it with instances of the other role
        # leaving along (2P2D at exactly 1:1 moves a prefill and a decode together).
        partners = [k for k in candidates if k[0] != key[0] and k not in leave]
        alone = why
        while why == REFUSED_BY_RATIO and partners:
            group |= {partners.pop(0)}
            why = refusal(group)
        if why is None:
            leave |= group
            now = serving(state, members, leave)
        else:
            refused |= {why, alone or why}
    return Plan(leave, members, now, {role: len(outdated[role]) for role in ROLES},
                _blocked(params, state, members, outdated, leave, stranded, held, refused))


def _pending(state: State, members: Members, leave: frozenset[Key]) -> bool:
    """Whether something will change without another instance leaving: an instance to be created,
    a new one loading (a decode one only once a prefill instance of its layout serves or loads:
    its KV link needs one)."""
    prefill_layouts = {s.layout for i, s in state.get("prefill", {}).items()
                       if i in members["prefill"] and ("prefill", i) not in leave and (s.ready or s.updated)}
    for role in ROLES:
        have = state.get(role, {})
        for i in sorted(members[role]):
            if i not in have:
                return True
            s = have[i]
            if s.updated and not s.ready and (role == "prefill" or s.layout in prefill_layouts):
                return True
    return False


def _blocked(params: Mapping[str, RoleParams], state: State, members: Members,
             outdated: Mapping[str, list[int]], leave: frozenset[Key], stranded: list[str],
             held: Mapping[str, set[str]], refused: Collection[str]) -> str | None:
    """Nothing moves and nothing is on its way, yet instances wait to move: no order keeps enough
    serving. Say what to change."""
    waiting = [role for role in ROLES if outdated[role] and params[role].moving]
    for role in stranded:
        if role in waiting:
            return (f"The new {role} template changes the KV layout, and "
                    f"spec.{other(role)}.rollout.partition keeps every {other(role)} instance on the old "
                    f"one: new {role} instances could pair with none. Lower "
                    f"spec.{other(role)}.rollout.partition, or return spec.{role} to the old template.")
    if not waiting or leave or _pending(state, members, leave):
        return None
    roles = " and ".join(waiting)
    if REFUSED_BY_PARTITION in refused:
        holding = [role for role in ROLES if held[role]]
        return (f"The last outdated {roles} instances of an old KV layout stay: "
                f"spec.{' and spec.'.join(holding)}.rollout.partition holds instances on that layout, and "
                "they would pair with nothing without them. Lower that partition to move both, or give "
                "both roles the same partition.")
    if REFUSED_BY_RATIO in refused:
        return (f"No outdated {roles} instance can leave without taking the serving prefill:decode ratio "
                "outside spec.scaling.ratio. Set spec.prefill.rollout.maxSurge and "
                "spec.decode.rollout.maxSurge to 1 or more, raise maxUnavailable so instances of both roles "
                "leave together, or widen spec.scaling.ratio.")
    return (f"No outdated {roles} instance can leave while each role keeps replicas - maxUnavailable "
            "instances serving: a prefill instance serves only with a decode instance of its KV layout "
            "and the other way round (a new image or block size is a new layout, and a role of one "
            "instance has no other to serve meanwhile). Set spec.prefill.rollout.maxSurge and "
            "spec.decode.rollout.maxSurge to 1 (new instances come up first), or raise maxUnavailable.")


def outdated(params: Mapping[str, RoleParams], state: State) -> dict[str, int]:
    """Per role: instances at or above the partition still to move to the current revision."""
    return {role: len(_outdated(params[role], state.get(role, {}))) for role in ROLES}


class RoleFigures(NamedTuple):
    """What the rollout's progress is a change of, per role (and what status.<role> reports)."""

    revision: str
    """The role's current revision (render/workloads.py Templates)."""
    updated: int
    """Instances of the spec's whose pods all run it."""
    ready: int
    """Instances of the spec's whose pods are all Ready."""


Figures = Mapping[str, RoleFigures]


def revision_of(pods: list[dict]) -> str:
    """The revision an instance's pods run: theirs, `mixed`, or empty without pods."""
    revisions = {label(p, REVISION) or "" for p in pods}
    return revisions.pop() if len(revisions) == 1 else "mixed" if revisions else ""


def figures(resolved: Resolved, revisions: Mapping[str, str], pods: list[dict], sizes: Sizes | None = None
            ) -> dict[str, RoleFigures]:
    """Each role's figures over its spec's instances; `revisions`: each role's current one; `sizes`:
    the pods each instance runs when whole (controller/revisions.py; None: the spec's shape)."""
    groups = by_instance(pods)
    out: dict[str, RoleFigures] = {}
    for role in ROLES:
        members = {i: groups.get((role, i), []) for i in range(resolved.role(role).replicas)}
        want = revisions[role]
        out[role] = RoleFigures(want, sum(1 for m in members.values() if m and revision_of(m) == want),
                                sum(1 for i, m in members.items()
                                    if instance_ready(m, expected_pods(resolved, sizes, role, i))))
    return out


def progressed_at(previous: datetime | None, figures_then: Figures | None, figures: Figures, active: bool,
                  now: datetime, moved: bool = False) -> datetime | None:
    """When the rollout last progressed: `now` when it starts, its figures (per role: the
    revision, instances updated, instances ready) changed since the last status, or it `moved`
    otherwise (an instance became Ready or finished draining, the spec changed, it resumed after
    being paused or blocked), else `previous`; None when no rollout is under way.
    What the progress deadline counts from (Deployments count the same way, and restart it on
    resume: kubernetes: pkg/controller/deployment/sync.go @ v1.36.3, checkPausedConditions)."""
    if not active:
        return None
    if moved or previous is None or figures_then is None or dict(figures_then) != dict(figures):
        return now
    return previous


def deadline(resolved: Resolved, role: str) -> int:
    """The progress deadline: the spec's, or the longest a healthy replacement takes (its drain
    bound, then loading the model)."""
    spec = resolved.role(role)
    return spec.rollout.progress_deadline_seconds or (
        spec.startup_timeout_seconds + int(drain.bound(resolved, role).total_seconds()))


def _parse_time(text: object, now: datetime) -> datetime | None:
    try:
        return datetime.strptime(str(text), drain.TIME_FORMAT).replace(tzinfo=now.tzinfo)
    except ValueError:
        return None


def _moved(resolved: Resolved, state: State, previous: dict, generation: int | None) -> bool:
    """Progress the figures do not show, since the status was written: the spec changed (a new
    rollout setting resumes a stopped rollout, as a new template does), it was held (paused or
    blocked: the clock starts again when it moves), an instance became Ready (a surge one too), or
    one that drained is gone."""
    if generation is not None and previous.get("observedGeneration") not in (None, generation):
        return True
    named = {resolved.names.instance(role, i): s for role in ROLES for i, s in state.get(role, {}).items()}
    ready_then = {i.get("name") for role in ROLES for i in (previous.get(role) or {}).get("instances") or []
                  if i.get("ready")}
    drained = {d.get("name") for d in previous.get("draining") or []} - set(named)
    held_then = any(cond.get("type") == c.PROGRESSING
                    and cond.get("reason") in (c.ROLLOUT_PAUSED, c.ROLLOUT_BLOCKED)
                    for cond in previous.get("conditions") or [])
    return held_then or bool(drained) or any(s.ready and name not in ready_then for name, s in named.items())


def step(resolved: Resolved, state: dict[str, dict[int, InstanceState]], now_figures: Figures,
         previous: dict, now: datetime, generation: int | None = None, layout: str | None = None) -> Rollout:
    """The rollout's next step and its clock, from the instances as observed (controller/gate.py
    observe), their figures, the previous status (`rolloutProgressTime`, the roles' figures and
    instances, the draining ones, `observedGeneration`) and the spec's `generation`. `layout`: the
    one the current templates pair as (render/workloads.py Templates.paired; None: the spec's)."""
    layout = layout or resolved.layout_hash
    limits: dict[str, int] = {role: deadline(resolved, role) for role in ROLES}
    # A new template (applying the previous spec again, say) is progress too: as a Deployment's new
    # ReplicaSet restarts its deadline, else a halted rollout could never be rolled back.
    then: dict[str, RoleFigures] = {
        role: RoleFigures(str((previous.get(role) or {}).get("revision", "")),
                          int((previous.get(role) or {}).get("updatedInstances", -1)),
                          int((previous.get(role) or {}).get("readyInstances", -1))) for role in ROLES}
    # Under way while outdated instances remain, and after that until the replaced ones are Ready
    # (a new template that never starts stops at its deadline even on the last instance) and the
    # surge instances are gone (they hold NPUs until drained).
    starting = any(i not in state[role] or not state[role][i].ready
                   for role in ROLES for i in range(resolved.role(role).replicas))
    params = params_of(resolved)
    surge = bool(surplus(params, state))
    active = any(outdated(params, state).values()) or (
        previous.get("rolloutProgressTime") is not None and (starting or surge))
    ratio = resolved.deployment.spec.scaling.ratio
    free = plan(params, state, layout, ratio)  # what it would do without a deadline
    waiting = [role for role in ROLES if free.outdated[role]]
    held = bool(free.blocked) or bool(waiting) and not free.leave and all(params[r].paused for r in waiting)
    since = progressed_at(_parse_time(previous.get("rolloutProgressTime"), now), then, now_figures, active,
                          now, not held and _moved(resolved, state, previous, generation))
    halted: set[str] = {role for role in ROLES if not held  # the clock stops while held
                        and since is not None and (now - since).total_seconds() > limits[role]}
    chosen = params_of(resolved, halted)
    return Rollout(plan(chosen, state, layout, ratio), state, chosen, since, limits)

"""The rollout planner (controller/rollout.py) walked exhaustively over small shapes, as
kubernetes-sigs/lws tests its disaggregated-set planner (pkg/controllers/disaggregatedset/ @ main).

Two checks:
- every combination of instance states (updated or not, Ready or not, leaving or not) for 1..3
  prefill and 1..3 decode instances, with every rollout setting: one planning step never takes a
  role below `replicas - maxUnavailable` serving (nor lower than it already was), only moves
  outdated instances at or above the partition, and moves none while paused or halted;
- from every shape and setting, every interleaving of what the cluster does next (a leaving
  instance drained and replaced, a new instance Ready, a surge instance gone), with a new KV layout
  and without: every reachable state keeps `replicas - maxUnavailable` serving per role and pairs
  prefill and decode only within one layout; the walk always ends, and it ends with every
  instance at or above the partition updated, Ready and no surge left, unless the planner said
  `blocked` (only possible when the layout changes without surge).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from pd_operator.api.types import ROLES, RatioBounds, RolloutSpec
from pd_operator.controller.rollout import (
    InstanceState,
    Plan,
    RoleFigures,
    RoleParams,
    Rollout,
    available,
    other,
    plan,
    progressed_at,
    serving,
    step,
)
from pd_operator.spec.scaling import ratio_excess
from pd_operator.spec.validate import Resolved
from support.specs import example, resolve

OLD, NEW = "old-layout", "new-layout"
SETTINGS = [(mu, ms) for mu in (0, 1, 2) for ms in (0, 1) if mu or ms]
"""(maxUnavailable, maxSurge): both 0 is refused by the API."""

Frozen = tuple[tuple[tuple[int, InstanceState], ...], ...]


def freeze(state: dict[str, dict[int, InstanceState]]) -> Frozen:
    return tuple(tuple(sorted(state[role].items())) for role in ROLES)


def thaw(frozen: Frozen) -> dict[str, dict[int, InstanceState]]:
    return {role: dict(items) for role, items in zip(ROLES, frozen, strict=True)}


def params_for(p: int, d: int, mu: int, ms: int, partition: int | tuple[int, int] = 0, **flags: bool
               ) -> dict[str, RoleParams]:
    """`partition`: both roles', or (prefill's, decode's)."""
    parts = partition if isinstance(partition, tuple) else (partition, partition)
    return {role: RoleParams(n, mu, ms, part, **flags)
            for role, n, part in (("prefill", p, parts[0]), ("decode", d, parts[1]))}


def apply(params: dict[str, RoleParams], state: dict[str, dict[int, InstanceState]], new: str,
          ratio: RatioBounds | None = None) -> tuple[dict[str, dict[int, InstanceState]], Plan]:
    """What reconciles do with plans until one changes nothing: members a plan names leave
    (drain), surge instances it wants are created from the new template."""
    while True:
        step = plan(params, state, new, ratio)
        check_budget(params, state, step)
        if ratio is not None:
            check_ratio(state, step, ratio)
        out = {role: {i: replace(s, leaving=(role, i) in step.leave) for i, s in state[role].items()}
               for role in ROLES}
        for role in ROLES:
            for i in step.instances[role]:
                out[role].setdefault(i, InstanceState(updated=True, ready=False, layout=new))
        if out == state:
            return state, step
        state = out


def check_budget(params: dict[str, RoleParams], state: dict[str, dict[int, InstanceState]], step: Plan
                 ) -> None:
    """A role whose plan takes another instance out keeps `replicas - maxUnavailable` available:
    not leaving, and not a new instance still loading (an un-Ready outdated one may recover)."""
    for role in ROLES:
        if any(r == role and not state[r][i].leaving for r, i in step.leave):
            kept = available(state, step.instances, step.leave, role)
            assert kept >= params[role].minimum, (role, state, step)


def check_ratio(state: dict[str, dict[int, InstanceState]], step: Plan, ratio: RatioBounds) -> None:
    """What the plan takes out leaves the serving prefill:decode ratio within `ratio`, or no
    further outside it than the instances already leaving did."""
    committed = frozenset((r, i) for r, i in step.leave if state[r][i].leaving)
    before, after = serving(state, step.instances, committed), step.serving
    assert (ratio_excess(after["prefill"], after["decode"], ratio)
            <= ratio_excess(before["prefill"], before["decode"], ratio)), (state, step)


def events(params: dict[str, RoleParams], state: dict[str, dict[int, InstanceState]], step: Plan,
           new: str, blips: int = 0) -> Iterator[tuple[dict[str, dict[int, InstanceState]], int]]:
    """Every next state the cluster can move to, with the readiness losses (`blips`) left."""
    routable = step.routable(state)
    for role in ROLES:
        for i, s in state[role].items():
            if s.ready and not s.leaving and blips:  # a readiness blip: a probe fails for a while
                yield {**state, role: {**state[role], i: replace(s, ready=False)}}, blips - 1
            if not s.updated and not s.ready and not s.leaving:  # the blip passes
                yield {**state, role: {**state[role], i: replace(s, ready=True)}}, blips
            if s.leaving:  # drained: its pods are replaced from the new template
                yield {**state, role: {**state[role], i: InstanceState(True, False, new)}}, blips
            # A decode instance's KV link needs a listed prefill instance of its layout.
            elif s.updated and not s.ready and (role == "prefill"
                                                or s.layout in routable["prefill"].values()):
                yield {**state, role: {**state[role], i: replace(s, ready=True)}}, blips
            if i not in step.instances[role]:  # one past replicas the plan no longer wants drained away
                yield {**state, role: {k: v for k, v in state[role].items() if k != i}}, blips


def check_invariants(params: dict[str, RoleParams], state: dict[str, dict[int, InstanceState]],
                     step: Plan) -> None:
    counts = step.instances
    now = serving(state, counts, step.leave)
    for role in ROLES:
        assert now[role] >= params[role].minimum, (role, state, step)
    # Every routable prefill/decode pair the proxy could form shares a layout: the proxy pairs by
    # the layout each member carries; check that what it is given carries the pods' own layout.
    routable = step.routable(state)
    for role in ROLES:
        for i, layout in routable[role].items():
            assert state[role][i].layout == layout and state[role][i].ready


def check_surplus(params: dict[str, RoleParams], state: dict[str, dict[int, InstanceState]], step: Plan
                  ) -> None:
    """Of the instances past replicas, the plan never keeps an outdated one while it drops an
    updated one (a scale-down mid-surge keeps the new instance)."""
    for role in ROLES:
        past = {i: s for i, s in state[role].items() if i >= params[role].replicas}
        kept = [s for i, s in past.items() if i in step.instances[role]]
        dropped = [s for i, s in past.items() if i not in step.instances[role]]
        assert not (any(not s.updated for s in kept) and any(s.updated for s in dropped)), (role, state, step)


def walk(params: dict[str, RoleParams], new: str, blips: int = 0, ratio: RatioBounds | None = None,
         ends: list[tuple[dict[str, dict[int, InstanceState]], Plan]] | None = None,
         floor: dict[str, int] | None = None, start: dict[str, dict[int, InstanceState]] | None = None,
         strict: bool = True, visited: list[dict[str, dict[int, InstanceState]]] | None = None
         ) -> tuple[int, set[str]]:
    """(states visited, blocked messages at the ends) from `start` (default: every instance old and
    Ready); `blips`: how many times some Ready instance may lose readiness for a while on the way
    (then the serving minimum is not the planner's to keep, the budget is; nor with `strict` off:
    after a replica change). `ratio`: spec.scaling.ratio; `ends` collects the end states and their
    plans, `visited` every state, `floor` the fewest instances of each role serving in any state
    (without blips)."""
    start = start or {role: {i: InstanceState(False, True, OLD) for i in range(params[role].replicas)}
                      for role in ROLES}
    seen: set[tuple[Frozen, int]] = set()
    todo = [(start, blips)]
    blocked: set[str] = set()
    while todo:
        before, left = todo.pop()
        state, step = apply(params, before, new, ratio)
        key = (freeze(state), left)
        if key in seen:
            continue
        seen.add(key)
        if visited is not None:
            visited.append(state)
        check_surplus(params, state, step)
        if left == blips and strict:
            check_invariants(params, state, step)
            if floor is not None:
                for role in ROLES:
                    floor[role] = min(floor.get(role, params[role].replicas), step.serving[role])
        nexts = list(events(params, state, step, new, left))
        if not nexts:  # the end: done, or the planner says why not
            if ends is not None:
                ends.append((state, step))
            if step.blocked:
                blocked.add(step.blocked)
            else:
                below = {role: min(params[role].partition, params[role].replicas) for role in ROLES}
                assert step.complete, (params, state)
                for role in ROLES:
                    assert set(state[role]) == set(range(params[role].replicas))
                    for i, s in state[role].items():
                        assert s.ready and s.updated == (i >= below[role]), (role, i, state)
        todo.extend(nexts)
    return len(seen), blocked


SHAPES = [(p, d) for p in (1, 2, 3) for d in (1, 2, 3)]


def must_finish(p: int, d: int, mu: int, ms: int, partition: int, layout_change: bool) -> bool | None:
    """Whether the rollout can always finish (None: it depends on the order things come up in).
    With surge a new instance comes up first. Without: a role of one instance leaves nothing of
    itself serving, and so nothing of the other role either; with a new layout old and new never
    pair, so whether a pair keeps serving depends on the counts."""
    if ms >= 1:
        return True
    if layout_change:
        return None
    return partition > 0 or not ((p == 1 and d - mu > 0) or (d == 1 and p - mu > 0))


@pytest.mark.parametrize("p,d", SHAPES)
@pytest.mark.parametrize("layout_change", [False, True])
def test_walk_keeps_serving_and_ends_updated(p: int, d: int, layout_change: bool) -> None:
    new = NEW if layout_change else OLD
    for (mu, ms), partition in itertools.product(SETTINGS, (0, 1)):
        params = params_for(p, d, mu, ms, partition)
        visited, blocked = walk(params, new)
        assert visited > 1 or blocked or partition >= max(p, d)  # something moved, unless it may not
        finish = must_finish(p, d, mu, ms, partition, layout_change)
        held = layout_change and partition >= min(p, d)  # one role kept whole on the old layout
        if held:
            assert all("partition" in b for b in blocked), blocked
            continue
        if finish is True or partition >= max(p, d):
            assert not blocked, (p, d, mu, ms, partition, blocked)
        elif finish is False:
            assert blocked, (p, d, mu, ms, partition)
        assert all("maxSurge" in b for b in blocked)


def test_the_issue_shape_rolls_a_new_image_with_defaults() -> None:
    """2 prefill + 2 decode, defaults (1 unavailable, no surge), a new image (so a new layout)."""
    _, blocked = walk(params_for(2, 2, 1, 0), NEW)
    assert not blocked


def test_one_decode_and_a_new_layout_without_surge_is_held_with_advice() -> None:
    """3 prefill + 1 decode, no surge: the single decode cannot leave while old prefill instances
    must serve, and no old prefill can pair with a new decode. The walk holds rather than breaking
    the minimum, and says to surge."""
    _, blocked = walk(params_for(3, 1, 1, 0), NEW)
    assert blocked and all("maxSurge" in b for b in blocked)


STATES = [InstanceState(u, r, NEW if u else OLD, leaving) for u in (False, True) for r in (False, True)
          for leaving in (False, True) if not (u and leaving)]
"""One instance's possible states (an updated instance no longer leaves: it was replaced)."""


def check_step(params: dict[str, RoleParams], state: dict[str, dict[int, InstanceState]]) -> None:
    step = plan(params, state, NEW)
    partition = {role: params[role].partition for role in ROLES}
    committed = frozenset((role, i) for role in ROLES for i, s in state[role].items()
                          if s.leaving and not s.updated and i >= partition[role])
    before = serving(state, step.instances, committed)
    after = serving(state, step.instances, step.leave)
    for role in ROLES:
        assert after[role] >= min(before[role], params[role].minimum), (role, state, step)
    for role, i in step.leave:
        assert not state[role][i].updated and i >= partition[role]
    if params["prefill"].paused:
        assert step.leave == committed


def role_states(n: int, ordered: bool) -> Iterator[dict[int, InstanceState]]:
    pick = (itertools.product(STATES, repeat=n) if ordered
            else itertools.combinations_with_replacement(STATES, n))
    return (dict(enumerate(combo)) for combo in pick)


@pytest.mark.parametrize("p,d", SHAPES)
def test_one_step_from_any_state(p: int, d: int) -> None:
    """From every combination of instance states, one plan never lowers a role's serving below
    its minimum (or below what it was), and moves only what it may. Without a partition the
    ordinals do not matter to that, so each role's states are taken as a multiset; with one, every
    ordering (of the smaller shapes)."""
    for pre, dec in itertools.product(role_states(p, False), role_states(d, False)):
        state = {"prefill": pre, "decode": dec}
        for (mu, ms), paused in itertools.product(SETTINGS, (False, True)):
            check_step(params_for(p, d, mu, ms, paused=paused), state)
    if p + d > 5:
        return
    for pre, dec in itertools.product(role_states(p, True), role_states(d, True)):
        for mu, ms in SETTINGS:
            check_step(params_for(p, d, mu, ms, partition=1), {"prefill": pre, "decode": dec})


def test_serving_counts_only_paired_layouts() -> None:
    state = {"prefill": {0: InstanceState(False, True, OLD), 1: InstanceState(True, True, NEW)},
             "decode": {0: InstanceState(True, True, NEW)}}
    assert serving(state, {"prefill": {0, 1}, "decode": {0}}, frozenset()) == {"prefill": 1, "decode": 1}
    assert other("prefill") == "decode"


def test_halted_moves_nothing_new_and_keeps_surge() -> None:
    """A passed progress deadline: no instance leaves that was not leaving, surge instances that
    run stay (they serve in place of the stuck one)."""
    state = {"prefill": {0: InstanceState(False, True, OLD), 1: InstanceState(True, False, NEW),
                         2: InstanceState(True, True, NEW)},
             "decode": {0: InstanceState(False, True, OLD), 1: InstanceState(False, True, OLD)}}
    params = params_for(2, 2, 1, 1, halted=True)
    step = plan(params, state, NEW)
    assert step.leave == frozenset() and step.instances["prefill"] == {0, 1, 2}
    assert not step.complete and step.blocked is None


def test_the_progress_clock_restarts_on_progress_and_on_a_new_template() -> None:
    """A halted rollout rolled back by applying the previous spec again moves the stuck instance
    back: as many instances updated and Ready as before, but on another revision, which is progress
    (else the halt would outlive the spec that caused it)."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    later = start + timedelta(hours=1)
    stuck = {"prefill": ("bad", 1, 1), "decode": ("bad", 1, 1)}
    assert progressed_at(start, stuck, stuck, True, later) == start
    assert progressed_at(start, stuck, {**stuck, "decode": ("bad", 2, 1)}, True, later) == later
    assert progressed_at(start, stuck, {role: ("old", 1, 1) for role in ROLES}, True, later) == later
    assert progressed_at(None, None, stuck, True, later) == later
    assert progressed_at(start, stuck, stuck, False, later) is None


def test_a_readiness_blip_replaces_at_most_the_budget() -> None:
    """3 prefill + 4 decode, the decodes un-Ready for one round (a blip), a new template: the
    prefill instances serve nothing meanwhile (no Ready decode), yet at most maxUnavailable of each
    role leave, not all 7."""
    state = {"prefill": {i: InstanceState(False, True, OLD) for i in range(3)},
             "decode": {i: InstanceState(False, False, OLD) for i in range(4)}}
    for mu, ms in SETTINGS:
        step = plan(params_for(3, 4, mu, ms), state, NEW)
        for role in ROLES:
            assert sum(1 for r, _ in step.leave if r == role) <= mu, (mu, ms, role, step.leave)


PARTITIONS = [(0, 0), (1, 0), (0, 1), (1, 2)]
"""(prefill's, decode's): the same or different per role."""


@pytest.mark.parametrize("p,d", [(p, d) for p, d in SHAPES if p + d <= 4])
@pytest.mark.parametrize("layout_change", [False, True])
def test_walk_with_a_readiness_blip_and_partitions_per_role(p: int, d: int, layout_change: bool) -> None:
    """As the walk above, with one Ready instance (any, at any point) losing readiness for a while
    and each role its own partition: every plan keeps the role's budget (check_budget), the walk
    ends, and it ends updated at or above each partition, or held with advice."""
    new = NEW if layout_change else OLD
    for (mu, ms), partition in itertools.product(SETTINGS, PARTITIONS):
        _, blocked = walk(params_for(p, d, mu, ms, partition), new, blips=1)
        assert all("maxSurge" in b or "partition" in b for b in blocked), (mu, ms, partition, blocked)
        if not layout_change:
            assert not blocked or ms == 0, (mu, ms, partition, blocked)


T0 = datetime(2026, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(hours=3)
"""Far past the deadline the clock tests set (600 s)."""


def clock_spec(prefill: dict | None = None, decode: dict | None = None, **rollout: object) -> Resolved:
    """The 1P1D example with `rollout` on both roles (a 600 s deadline), and per-role extras."""
    doc = example()
    for role, extra in (("prefill", prefill), ("decode", decode)):
        doc["spec"][role]["rollout"] = {"progressDeadlineSeconds": 600, **rollout}
        doc["spec"][role].update(extra or {})
    return resolve(doc)


def clock_step(resolved: Resolved, state: dict[str, dict[int, InstanceState]], generation: int = 1,
               instances: dict[str, list[dict]] | None = None, **status: object) -> Rollout:
    """One step at LATER, the last progress at T0, the figures as the previous status had them and
    its instances (by default: as now)."""
    if instances is None:
        instances = {role: [{"name": resolved.names.instance(role, i), "ready": s.ready}
                            for i, s in state[role].items()] for role in ROLES}
    figures = {role: RoleFigures("new-rev", 0, 1) for role in ROLES}
    previous = {"rolloutProgressTime": T0.strftime("%Y-%m-%dT%H:%M:%SZ"), "observedGeneration": 1,
                **{role: {"revision": "new-rev", "updatedInstances": 0, "readyInstances": 1,
                          "instances": instances.get(role, [])} for role in ROLES}, **status}
    return step(resolved, state, figures, previous, LATER, generation)


def old_pair() -> dict[str, dict[int, InstanceState]]:
    return {role: {0: InstanceState(False, True, OLD)} for role in ROLES}


def halted(moving: Rollout) -> set[str]:
    return {role for role in ROLES if moving.params[role].halted}


def test_the_deadline_stops_steps_and_a_new_setting_resumes() -> None:
    """No progress for 3 h on a 600 s deadline: the rollout stops (no instance leaves). Any spec
    change (a rollout setting, not only a new template) starts the clock again, as re-applying does."""
    moving = clock_step(clock_spec(), old_pair())
    assert halted(moving) == set(ROLES) and not moving.plan.leave
    resumed = clock_step(clock_spec(maxSurge=1), old_pair(), generation=2)
    assert resumed.since == LATER and not halted(resumed)


def test_the_clock_stops_while_paused() -> None:
    """Paused 3 h, then resumed: not stopped by the deadline, and the clock counts from the resume."""
    assert not halted(clock_step(clock_spec(paused=True), old_pair()))
    paused_then = {"conditions": [{"type": "Progressing", "status": "Unknown", "reason": "RolloutPaused"}]}
    resumed = clock_step(clock_spec(), old_pair(), **paused_then)
    assert not halted(resumed) and resumed.since == LATER
    # It moves again: with the defaults a surge instance of each role comes up first.
    assert resumed.plan.instances == {"prefill": {0, 1}, "decode": {0, 1}}


def test_the_clock_stops_while_blocked() -> None:
    """A KV-layout change that the decode's partition holds on the old layout: blocked (saying
    what to change), not stopped by the deadline."""
    moving = clock_step(clock_spec(decode={"rollout": {"progressDeadlineSeconds": 600, "partition": 1}}),
                        old_pair())
    assert moving.plan.blocked and "partition" in moving.plan.blocked
    assert not halted(moving)


def test_a_surge_instance_ready_or_an_instance_drained_is_progress() -> None:
    """The figures count the spec's instances only; a surge instance becoming Ready, or an instance
    that drained and is gone, is progress too."""
    resolved = clock_spec(maxSurge=1, maxUnavailable=0)
    surge = {**old_pair(), "prefill": {0: InstanceState(False, True, OLD), 1: InstanceState(True, True, NEW)}}
    name = resolved.names.instance("prefill", 1)
    was = {"prefill": [{"name": resolved.names.instance("prefill", 0), "ready": True},
                       {"name": name, "ready": False}],
           "decode": [{"name": resolved.names.instance("decode", 0), "ready": True}]}
    moving = clock_step(resolved, surge, instances=was)
    assert moving.since == LATER and not halted(moving)
    assert halted(clock_step(resolved, surge))
    drained = clock_step(resolved, old_pair(), draining=[{"name": name}])
    assert drained.since == LATER and not halted(drained)


@pytest.mark.parametrize("given", [{}, {"maxSurge": 1}], ids=["defaults", "maxSurge-1-alone"])
@pytest.mark.parametrize("layout_change", [False, True])
def test_the_defaults_keep_every_instance_serving(given: dict, layout_change: bool) -> None:
    """The API's defaults (and `maxSurge: 1` with nothing else set), a role of one instance
    included: every reachable state serves `replicas` of each role, and the rollout ends updated,
    never blocked (a warning would not count)."""
    spec = RolloutSpec.model_validate(given)
    for p, d in SHAPES:
        params = params_for(p, d, spec.max_unavailable, spec.max_surge)
        floor: dict[str, int] = {}
        _, blocked = walk(params, NEW if layout_change else OLD, floor=floor)
        assert not blocked, (p, d, blocked)
        assert floor == {"prefill": p, "decode": d}, (p, d, floor)


RATIOS = [RatioBounds(min_prefill_per_decode=1, max_prefill_per_decode=1),
          RatioBounds(min_prefill_per_decode=0.5), RatioBounds(max_prefill_per_decode=1.5)]


@pytest.mark.parametrize("ratio", RATIOS,
                         ids=lambda r: f"{r.min_prefill_per_decode}-{r.max_prefill_per_decode}")
def test_no_step_takes_the_serving_ratio_outside_its_bounds(ratio: RatioBounds) -> None:
    """With spec.scaling.ratio set, no plan takes the serving prefill:decode ratio outside it (or
    further outside: check_ratio in every step of the walk), for shapes within it; with surge the
    rollout ends, or holds saying to widen the ratio (an exact 1:1 with a new layout can leave no
    single step that keeps it: an old prefill then serves only with an old decode)."""
    exact = ratio.min_prefill_per_decode == ratio.max_prefill_per_decode
    for p, d in SHAPES:
        if ratio_excess(p, d, ratio):
            continue
        for (mu, ms), layout_change in itertools.product(SETTINGS, (False, True)):
            _, blocked = walk(params_for(p, d, mu, ms), NEW if layout_change else OLD, ratio=ratio)
            if ms and not (exact and layout_change):
                assert not blocked, (p, d, mu, ms, blocked)
            assert all("spec.scaling.ratio" in b or "maxSurge" in b for b in blocked), blocked


def test_the_ratio_moves_instances_of_both_roles_together() -> None:
    """4 prefill + 4 decode at exactly 1 prefill per decode, 2 unavailable, no surge: two prefill
    instances alone would serve 2:4; the plan takes a prefill and a decode pair by pair."""
    state = {role: {i: InstanceState(False, True, OLD) for i in range(4)} for role in ROLES}
    exact = RatioBounds(min_prefill_per_decode=1, max_prefill_per_decode=1)
    step = plan(params_for(4, 4, 2, 0), state, OLD, exact)
    assert step.serving == {"prefill": 2, "decode": 2}
    assert sorted(r for r, _ in step.leave) == ["decode", "decode", "prefill", "prefill"]
    decode_done = {i: InstanceState(True, True, OLD) for i in range(4)}
    alone = plan(params_for(4, 4, 2, 0), {**state, "decode": decode_done}, OLD,
                 RatioBounds(min_prefill_per_decode=1))
    assert not alone.leave and alone.blocked and "spec.scaling.ratio" in alone.blocked


@pytest.mark.parametrize("partition", [(1, 0), (0, 1), (2, 0), (1, 2)])
def test_asymmetric_partitions_strand_no_old_instance(partition: tuple[int, int]) -> None:
    """A KV-layout change with a partition on one role only: the instances it holds on the old
    layout keep a partner of the other role on that layout (the rollout holds there, saying what to
    lower), so every Ready instance still serves at every end of the walk."""
    for (p, d), (mu, ms) in itertools.product([(2, 2), (3, 2), (2, 3)], SETTINGS):
        params = params_for(p, d, mu, ms, partition)
        ends: list[tuple[dict[str, dict[int, InstanceState]], Plan]] = []
        _, blocked = walk(params, NEW, ends=ends)
        for state, last in ends:
            ready = {role: sum(1 for i, s in state[role].items() if s.ready and i in last.instances[role]
                               and (role, i) not in last.leave) for role in ROLES}
            assert last.serving == ready, (p, d, mu, ms, partition, state)
        assert all("partition" in b or "maxSurge" in b for b in blocked), blocked


def test_a_scale_down_mid_surge_keeps_the_new_instance_and_drains_the_old() -> None:
    """2 decode instances, one surge instance on the new template Ready, then a scale-down to 1:
    the old instance 1 (now past replicas) leaves, the new one (2) stays as the surge and serves
    while instance 0 is replaced; a new one loading stays too, before an old one past replicas."""
    for ready in (True, False):
        state = {"prefill": {0: InstanceState(True, True, OLD)},
                 "decode": {0: InstanceState(False, True, OLD), 1: InstanceState(False, True, OLD),
                            2: InstanceState(True, ready, OLD)}}
        step = plan({"prefill": RoleParams(1, 0, 1), "decode": RoleParams(1, 0, 1)}, state, OLD)
        assert step.instances["decode"] == {0, 2}, (ready, step)
        assert (step.leave == {("decode", 0)}) is ready, (ready, step)


RESCALES = [(0, 1), (0, -1), (1, 1), (1, -1)]
"""(role index, change of its replicas)."""


@pytest.mark.parametrize("p,d", [(p, d) for p, d in SHAPES if p + d <= 3])
@pytest.mark.parametrize("layout_change", [False, True])
def test_walk_with_a_replica_change_midway(p: int, d: int, layout_change: bool) -> None:
    """From every state a rollout reaches, a role scaled up or down by one (spec.<role>.replicas,
    a PDRole's count) and the walk continues on the new counts: every plan keeps the budget, never
    keeps an outdated instance past replicas while it drops an updated one there, and the walk ends
    updated on the new counts, or held with advice."""
    new = NEW if layout_change else OLD
    for (mu, ms), (which, change) in itertools.product(SETTINGS, RESCALES):
        before = params_for(p, d, mu, ms)
        role = ROLES[which]
        if before[role].replicas + change < 1:
            continue
        after = {**before, role: replace(before[role], replicas=before[role].replicas + change)}
        ends: list[tuple[dict[str, dict[int, InstanceState]], Plan]] = []
        midway: list[dict[str, dict[int, InstanceState]]] = []
        walk(before, new, ends=ends, visited=midway)
        for state in midway:
            _, blocked = walk(after, new, start=state, strict=False)
            assert all("maxSurge" in b for b in blocked), (mu, ms, role, change, state, blocked)
            if not layout_change and ms:
                assert not blocked, (mu, ms, role, change, state, blocked)

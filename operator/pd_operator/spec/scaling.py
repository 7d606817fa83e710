"""spec.scaling: the instance counts the operator runs, from the counts the roles' PDRoles ask for.

Pure. A scaler (`kubectl scale`, an HPA, KEDA) only ever writes a PDRole's spec.replicas; what runs
is that request held at the bounds, so a scale that breaks a bound is not refused (the scaler would
retry) but held, and the PDRole and the PDDeployment say so. Per-role bounds come first; then the
ratio lowers the role that has too many instances for the other (it never adds instances nobody
asked for: they cost NPUs). Lowering stops at the role's minimum, and `findings` requires the two
minimums to satisfy the ratio, so a count that satisfies every bound is always reached.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from pd_operator.api.conditions import MAX_RATIO, MAX_REPLICAS, MIN_RATIO, MIN_REPLICAS
from pd_operator.api.types import ROLES, RatioBounds, ScalingSpec
from pd_operator.findings import Finding


@dataclass(frozen=True)
class Hold:
    """One role held away from the count its PDRole asks for, by `bound` (the last that moved it)."""

    role: str
    bound: str
    requested: int
    effective: int

    @property
    def field(self) -> str:
        if self.bound in (MIN_REPLICAS, MAX_REPLICAS):
            return f"spec.scaling.{self.role}.{self.bound[0].lower()}{self.bound[1:]}"
        return f"spec.scaling.ratio.{self.bound[0].lower()}{self.bound[1:]}"

    def message(self) -> str:
        held = (f"{self.role} asks for {self.requested} instances and runs {self.effective}, held by "
                f"{self.field}")
        other = "decode" if self.role == "prefill" else "prefill"
        advice = {
            MAX_REPLICAS: f"raise {self.field} to run more",
            MIN_REPLICAS: f"lower {self.field} to run fewer",
            MAX_RATIO: f"raise {self.field} or scale {other} up first",
            MIN_RATIO: f"lower {self.field} or scale {other} up first",
        }[self.bound]
        return f"{held}: {advice}."


@dataclass(frozen=True)
class Bounded:
    requested: dict[str, int]
    effective: dict[str, int]
    holds: list[Hold]
    """Roles whose effective count differs from the request, prefill first."""


def _ratio(value: float | None) -> Fraction | None:
    # Exact: 1.5 prefill per decode with 2 decode instances is 3, not 2.9999.
    return None if value is None else Fraction(str(value))


def ratio_excess(prefill: int, decode: int, ratio: RatioBounds) -> Fraction:
    """How far `prefill` instances per `decode` instance lie outside `ratio`, in prefill instances
    (0: within it). The rollout planner (controller/rollout.py) takes no step that raises it."""
    low, high = _ratio(ratio.min_prefill_per_decode), _ratio(ratio.max_prefill_per_decode)
    over = prefill - high * decode if high is not None else Fraction(0)
    under = low * decode - prefill if low is not None else Fraction(0)
    return max(Fraction(0), over, under)


def bound(requested: Mapping[str, int], scaling: ScalingSpec) -> Bounded:
    """The counts to run for the requested ones (role -> instances), held at `scaling`'s bounds.
    Assumes `findings(scaling)` is empty (validate refuses bounds that cannot hold)."""
    count: dict[str, int] = {role: requested[role] for role in ROLES}
    last: dict[str, str] = {}
    for role in ROLES:
        limits = scaling.role(role)
        if count[role] < limits.min_replicas:
            count[role], last[role] = limits.min_replicas, MIN_REPLICAS
        elif limits.max_replicas is not None and count[role] > limits.max_replicas:
            count[role], last[role] = limits.max_replicas, MAX_REPLICAS
    low, high = _ratio(scaling.ratio.min_prefill_per_decode), _ratio(scaling.ratio.max_prefill_per_decode)
    # Each step lowers one role and stops at its minimum, so this ends; it ends when both hold.
    while True:
        p, d = count["prefill"], count["decode"]
        if high is not None and p > high * d:
            count["prefill"] = max(math.floor(high * d), scaling.prefill.min_replicas)
            last["prefill"] = MAX_RATIO
        elif low is not None and p < low * d:
            count["decode"] = max(math.floor(p / low), scaling.decode.min_replicas)
            last["decode"] = MIN_RATIO
        else:
            break
        if (count["prefill"], count["decode"]) == (p, d):
            break  # bounds validate refuses; never loop on them
    holds = [Hold(role, last[role], requested[role], count[role]) for role in ROLES
             if count[role] != requested[role]]
    return Bounded(dict(requested), count, holds)


def findings(scaling: ScalingSpec) -> list[Finding]:
    """Bounds that cannot all hold: a minimum above its maximum, or minimums that break the ratio."""
    out = []
    for role in ROLES:
        limits = scaling.role(role)
        if limits.max_replicas is not None and limits.min_replicas > limits.max_replicas:
            out.append(Finding("ScalingBounds", "error", f"spec.scaling.{role}.minReplicas", "",
                               f"minReplicas {limits.min_replicas} is above maxReplicas "
                               f"{limits.max_replicas}; lower minReplicas or raise maxReplicas."))
    ratio = scaling.ratio
    low, high = _ratio(ratio.min_prefill_per_decode), _ratio(ratio.max_prefill_per_decode)
    if low is not None and high is not None and low > high:
        out.append(Finding("ScalingBounds", "error", "spec.scaling.ratio.minPrefillPerDecode", "",
                           f"minPrefillPerDecode {ratio.min_prefill_per_decode:g} is above "
                           f"maxPrefillPerDecode {ratio.max_prefill_per_decode:g}; swap or widen them."))
        return out
    p, d = scaling.prefill.min_replicas, scaling.decode.min_replicas
    if high is not None and p > high * d:
        out.append(Finding("ScalingBounds", "error", "spec.scaling.prefill.minReplicas", "",
                           f"prefill minReplicas {p} with decode minReplicas {d} is more than "
                           f"maxPrefillPerDecode {ratio.max_prefill_per_decode:g} allows; lower "
                           "spec.scaling.prefill.minReplicas or raise spec.scaling.decode.minReplicas."))
    if low is not None and p < low * d:
        out.append(Finding("ScalingBounds", "error", "spec.scaling.decode.minReplicas", "",
                           f"decode minReplicas {d} needs at least {math.ceil(low * d)} prefill instances "
                           f"(minPrefillPerDecode {ratio.min_prefill_per_decode:g}) but prefill "
                           f"minReplicas is {p}; raise spec.scaling.prefill.minReplicas or lower "
                           "spec.scaling.decode.minReplicas."))
    return out

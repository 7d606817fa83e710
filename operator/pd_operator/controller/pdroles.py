"""The roles' PDRoles as the reconcile reads and writes them. Pure: the reconcile does the I/O.

Source of truth: a PDRole's spec.replicas is the role's instance count once the PDRole exists.
`kubectl scale`, an HPA or KEDA write it through the scale subresource, and the operator must never
write it back, or it would flap with the scaler. The operator writes it in two cases only, each a
request of its own (never its server-side apply, which would then own the field and remove it when
a later apply leaves it out):

- create: no PDRole yet, so it is created with spec.<role>.replicas of the PDDeployment;
- forward: spec.<role>.replicas of the PDDeployment is not the value last forwarded (annotation
  pd.serving.dev/forwarded-replicas on the PDRole), so a user changed it: forwarded once, with the
  annotation. Comparing levels (not reacting to an edit event) keeps the reconcile level-based: a
  repeat finds them equal and writes nothing. Never while spec.<role>.autoscaling is set (the HPA
  owns the count); a change made then is forwarded when autoscaling is removed.

Every reconcile reads the count, holds it at spec.scaling's bounds (pd_operator.spec.scaling), runs that,
and reports it in the PDRole's status (replicas, readyReplicas, the leader selector an HPA needs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pd_operator.api.conditions import SCALING_LIMITED, WITHIN_BOUNDS
from pd_operator.api.labels import FORWARDED_REPLICAS
from pd_operator.api.types import API_VERSION, ROLE_KIND, ROLES, Condition, PDRoleStatus
from pd_operator.controller.diff import is_owned_by
from pd_operator.controller.rollout import RoleFigures
from pd_operator.render.pdroles import leader_selector
from pd_operator.spec.scaling import Hold
from pd_operator.spec.validate import Resolved


@dataclass(frozen=True)
class Ask:
    """What one role's PDRole asks for, and the write (if any) that makes it ask that."""

    role: str
    name: str
    """The PDRole's name."""
    requested: int
    create: bool = False
    forward: bool = False


def is_role(obj: dict) -> bool:
    return obj.get("apiVersion") == API_VERSION and obj.get("kind") == ROLE_KIND


def find(children: list[dict], name: str) -> dict | None:
    return next((c for c in children if is_role(c) and c["metadata"]["name"] == name), None)


def _replicas(obj: dict) -> int | None:
    value = (obj.get("spec") or {}).get("replicas")
    return value if isinstance(value, int) else None


def forwarded(obj: dict) -> str | None:
    return (obj.get("metadata", {}).get("annotations") or {}).get(FORWARDED_REPLICAS)


def asks(resolved: Resolved, children: list[dict], owner_uid: str) -> dict[str, Ask]:
    """Per role: the count its PDRole asks for after this reconcile's own writes."""
    dep, names = resolved.deployment, resolved.names
    out: dict[str, Ask] = {}
    for role in ROLES:
        spec, name = dep.role(role), names.role(role)
        found = find(children, name)
        if found is None:
            out[role] = Ask(role, name, spec.replicas, create=True)
        elif not is_owned_by(found, owner_uid):
            out[role] = Ask(role, name, spec.replicas)  # a foreign object holds the name (NameConflict)
        elif spec.autoscaling is None and forwarded(found) != str(spec.replicas):
            out[role] = Ask(role, name, spec.replicas, forward=True)
        else:
            current = _replicas(found)
            out[role] = Ask(role, name, spec.replicas if current is None else current)
    return out


def applied_form(manifest: dict) -> dict:
    """What the operator's server-side apply sends: a PDRole without spec.replicas (see module doc)."""
    if not is_role(manifest):
        return manifest
    out = json.loads(json.dumps(manifest))
    out["spec"].pop("replicas", None)
    return out


def creation(manifest: dict, replicas: int) -> dict:
    """The applied form of a PDRole (stamped) as created: asking for `replicas`, recorded as forwarded."""
    out = json.loads(json.dumps(manifest))
    out["spec"]["replicas"] = replicas
    out["metadata"].setdefault("annotations", {})[FORWARDED_REPLICAS] = str(replicas)
    return out


def forward_patch(replicas: int) -> dict:
    """The merge patch that forwards spec.<role>.replicas of the PDDeployment to its PDRole."""
    return {"metadata": {"annotations": {FORWARDED_REPLICAS: str(replicas)}}, "spec": {"replicas": replicas}}


def scaling_condition(hold: Hold | None, subject: str) -> tuple[bool, str, str]:
    """(status, reason, message) of condition ScalingLimited for one hold; `subject` names what
    asked (the PDRole)."""
    if hold is None:
        return False, WITHIN_BOUNDS, f"{subject} runs the instances it asks for."
    return True, hold.bound, f"{subject}: {hold.message()}"


def status(resolved: Resolved, role: str, effective: int, figures: RoleFigures, draining: int,
           hold: Hold | None, previous: dict, generation: int | None, now: str) -> dict:
    """The PDRole's whole status (through its model, api/types.py PDRoleStatus); the condition's
    lastTransitionTime moves only when its status does.
    `figures`: the role's (controller/rollout.py)."""
    ok, reason, message = scaling_condition(hold, f"PDRole {resolved.names.role(role)}")
    word: Literal["True", "False"] = "True" if ok else "False"
    prior = next((c for c in previous.get("conditions") or [] if c.get("type") == SCALING_LIMITED), None)
    since = prior.get("lastTransitionTime") if prior and prior.get("status") == word else None
    condition = Condition(type=SCALING_LIMITED, status=word, reason=reason, message=message,
                          observed_generation=generation, last_transition_time=since or now)
    return PDRoleStatus(replicas=effective, ready_replicas=figures.ready, updated_replicas=figures.updated,
                        draining=draining, selector=leader_selector(resolved.deployment.name, role),
                        conditions=[condition]).to_wire()

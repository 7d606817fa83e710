"""The one level-based reconcile of a PDDeployment: every trigger (create, update, resume, the
drift timer, a child's change) runs the same steps, so the outcome never depends on which one.

validate -> (invalid: status + event, children untouched) -> the instance counts the roles'
PDRoles ask for, held at spec.scaling's bounds (controller/roles.py, scaling.py) -> render those ->
gate the proxy (instances not Ready or not linked, a KV layout roll) -> plan against the observed
children -> hold the instances a scale-down removed until they drained (controller/drain.py) ->
apply what changed (owner reference included, so apply adopts; a missing PDRole is created with its
count, a changed spec.<role>.replicas forwarded) -> prune what the spec no longer wants -> group
restarts -> status of the PDRoles and the PDDeployment (written only when it changed) -> events on
significant transitions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pd_operator import scaling
from pd_operator.api.types import ROLES
from pd_operator.controller import drain, links, restarts, roles, rollout
from pd_operator.controller import status as status_mod
from pd_operator.controller.client import ApiError, Client, NotServed, ProxyUnreachable
from pd_operator.controller.planner import Plan, is_owned_by, key, plan, stamp
from pd_operator.controller.pods import is_terminating, label
from pd_operator.names import Names
from pd_operator.render import render
from pd_operator.render.labels import INSTANCE, ROLE
from pd_operator.render.proxy import COMPONENT as PROXY
from pd_operator.render.proxy import members as proxy_members
from pd_operator.validate import Validation, validate, with_instances

logger = logging.getLogger(__name__)


class InvalidSpec(Exception):
    """The spec cannot be served; retrying will not help until the user changes it."""


@dataclass
class Outcome:
    applied: list[dict] = field(default_factory=list)
    """Children as the API server returned them from this reconcile's writes (applies, annotations)."""
    pruned: list[dict] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    ready: bool = False
    kv_compatible: bool = False
    requeue_after: float | None = None
    """Seconds until this object should be reconciled again even if nothing changes (an instance
    drains); None: when something changes, or at the drift interval."""


def manifest_of(body: dict) -> dict:
    """The user's manifest as the validator wants it (no status, no server-managed metadata)."""
    meta = body["metadata"]
    return {"apiVersion": body["apiVersion"], "kind": body["kind"],
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "generation", "labels")
                         if k in meta},
            "spec": body.get("spec")}


def _names(objs: list[dict]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objs]


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _desired(validation: Validation, body: dict, pods: list[dict]) -> tuple[list[dict], bool]:
    dep = validation.deployment
    assert dep is not None
    layout = status_mod.layout_hash(validation)
    assert layout is not None
    gated, rolling = rollout.gate(
        render(validation), pods, Names(dep.name, dep.namespace),
        {role: validation.pod_plans[role].pods for role in ROLES},
        {role: dep.role(role).replicas for role in ROLES}, layout)
    return [stamp(roles.applied_form(m), body) for m in gated], rolling


def _apply(client: Client, namespace: str, the_plan: Plan, children: list[dict], asks: dict[str, roles.Ask],
           outcome: Outcome) -> list[dict]:
    """Apply (a missing PDRole: create it with its count), forward, prune; the children afterwards."""
    current = {key(c): c for c in children}
    for manifest in the_plan.apply:
        if roles.is_role(manifest) and key(manifest) not in current:
            ask = asks[manifest["spec"]["role"]]
            applied = client.create_role(roles.creation(manifest, ask.requested))
        else:
            applied = client.apply(manifest)
        current[key(manifest)] = applied
        outcome.applied.append(applied)
    for ask in asks.values():
        if ask.forward:
            forwarded = client.forward_replicas(namespace, ask.name, roles.forward_patch(ask.requested))
            current[key(forwarded)] = forwarded
            outcome.applied.append(forwarded)
    for obj in the_plan.prune:
        client.delete(obj)
        current.pop(key(obj), None)
        outcome.pruned.append(obj)
    return list(current.values())


def _read_proxies(client: Client, validation: Validation, pods: list[dict]) -> list[drain.ProxyRead] | None:
    """Every live proxy pod's state (None: no proxy routes to the instances)."""
    dep = validation.deployment
    assert dep is not None
    if not dep.spec.proxy.enabled:
        return None
    reads = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if label(pod, ROLE) != PROXY or is_terminating(pod) or not ip \
                or (pod.get("status") or {}).get("phase") != "Running":
            continue  # a proxy pod not running yet loads the current membership when it starts
        name = pod["metadata"]["name"]
        try:
            reads.append(drain.ProxyRead(name, client.read_proxy_state(ip, dep.spec.proxy.port)))
        except ProxyUnreachable as err:
            if not err.refused:  # refused: no proxy process listens there, so it carries nothing
                reads.append(drain.ProxyRead(name, None, str(err)))
    return reads


def _drains(client: Client, validation: Validation, body: dict, desired: list[dict], children: list[dict],
            pods: list[dict], now: datetime) -> list[drain.Drain]:
    """The drain of every instance a scale-down removed (see controller/drain.py)."""
    dep = validation.deployment
    assert dep is not None
    leaving = drain.departing(children, body["metadata"]["uid"],
                              {role: dep.role(role).replicas for role in ROLES})
    if not leaving:
        return []
    routes = [m for m in desired if m["kind"] == "ConfigMap"
              and m["metadata"]["name"] == Names(dep.name, dep.namespace).proxy_membership]
    written = proxy_members(routes[0]) if routes else None
    previous = (body.get("status") or {}).get("draining") or []
    return drain.drains(dep, leaving, previous, _read_proxies(client, validation, pods),
                        written.version if written else None, now)


def _report_drained(client: Client, body: dict, validation: Validation, drains: list[drain.Drain],
                    pruned: list[dict]) -> None:
    dep = validation.deployment
    assert dep is not None
    gone = {o["metadata"]["name"] for o in pruned if o["kind"] == "StatefulSet"}
    for d in drains:
        if d.name not in gone:
            continue
        if d.timed_out:
            client.post_event(body, "Warning", "DrainTimedOut",
                              f"Deleted {d.role} instance {d.name}: its drain bound "
                              f"({int(drain.bound(dep, d.role).total_seconds())} s) passed while it may "
                              "still have held requests.")
        else:
            client.post_event(body, "Normal", "Drained",
                              f"Deleted {d.role} instance {d.name}: it left the proxy and no request "
                              "needs it any more.")


def _group_restarts(client: Client, body: dict, children: list[dict], pods: list[dict], now: datetime,
                    outcome: Outcome) -> list[restarts.Decision]:
    uid = body["metadata"]["uid"]
    decisions = []
    for sts in children:
        if sts["kind"] != "StatefulSet" or not is_owned_by(sts, uid):
            continue
        role, index = label(sts, ROLE), label(sts, INSTANCE)
        members = [p for p in pods if label(p, ROLE) == role and label(p, INSTANCE) == index]
        decision = restarts.decide(sts, members, now)
        if decision.action in ("restart", "replace"):
            ns = sts["metadata"]["namespace"]
            if decision.action == "restart":  # the Degraded=GroupRestart transition posts the event
                annotated = client.annotate_stateful_set(ns, decision.instance, decision.annotations())
                outcome.applied.append(annotated)
            for pod in members:
                if pod["metadata"]["name"] in decision.pods:
                    client.delete_pod(ns, pod["metadata"]["name"], pod["metadata"]["uid"])
            outcome.restarted.append(decision.instance)
        if decision.action != "none":
            decisions.append(decision)
    return decisions


def _report_not_served(client: Client, body: dict, validation: Validation, children: list[dict],
                       pods: list[dict], err: NotServed, now: datetime, outcome: Outcome) -> None:
    """The cluster does not serve a child's kind (a PodGroup of spec.scheduling.gang without its API
    or CRD): the apply stopped there, before the StatefulSets. Say so in the status, then let the
    error go up (logged on one line; the drift loop retries, so installing the API is enough)."""
    observed = status_mod.Observed(children=children, pods=pods, unserved=err.manifest,
                                   unserved_error=str(err))
    _write_status(client, body, validation, observed, now, outcome)


def _kv_links(client: Client, validation: Validation, pods: list[dict], previous: dict) -> list[dict]:
    dep = validation.deployment
    assert dep is not None

    def read(pod: str) -> dict | None:
        try:
            return links.parse_round(client.read_pod_log(dep.namespace, pod, links.LINK_CONTAINER))
        except ApiError as err:  # the figures only; the link state comes from the pod's readiness
            logger.info("Cannot read the KV-link round of %s/%s: %s", dep.namespace, pod, err,
                        extra={"object": f"{dep.namespace}/{dep.name}"})
            return None

    return links.link_status(dep, pods, previous.get("kvLinks") or [], read,
                             validation.pod_plans["decode"].pods)


def _write_status(client: Client, body: dict, validation: Validation, observed: status_mod.Observed,
                  now: datetime, outcome: Outcome) -> None:
    meta = body["metadata"]
    previous = body.get("status") or {}
    new = status_mod.status(validation, observed, previous, meta.get("generation"),
                            now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    conditions = {c["type"]: c["status"] for c in new["conditions"]}
    outcome.ready = conditions.get("Ready") == "True"
    outcome.kv_compatible = conditions.get("KVCompatible") == "True"
    if new == previous:
        return
    client.patch_status(meta["namespace"], meta["name"], status_mod.merge_patch(previous, new))
    for type_, reason, message in status_mod.transitions(previous.get("conditions") or [], new["conditions"]):
        client.post_event(body, type_, reason, message)


def _write_role_statuses(client: Client, validation: Validation, observed: status_mod.Observed, uid: str,
                         now: datetime, outcome: Outcome) -> None:
    """Each owned PDRole's status (what its scale subresource reports), written when it changed."""
    dep = validation.deployment
    assert dep is not None and observed.scaling is not None
    ready = status_mod.ready_counts(validation, observed)
    holds = {h.role: h for h in observed.scaling.holds}
    names = Names(dep.name, dep.namespace)
    for role in ROLES:
        found = roles.find(observed.children, names.role(role))
        if found is None or not is_owned_by(found, uid):
            continue
        previous = found.get("status") or {}
        draining = sum(1 for d in observed.draining or [] if d["role"] == role)
        new = roles.status(dep, role, observed.scaling.effective[role], ready[role], draining,
                           holds.get(role), previous, found["metadata"].get("generation"),
                           now.strftime("%Y-%m-%dT%H:%M:%SZ"))
        if new != previous:
            outcome.applied.append(client.patch_role_status(dep.namespace, names.role(role), new))


def reconcile(client: Client, body: dict, children: list[dict], pods: list[dict],
              now: datetime | None = None) -> Outcome:
    """Bring the children of one PDDeployment to its spec. `children` and `pods` are the objects
    carrying its `pd.serving.dev/deployment` label, as observed. Raises InvalidSpec (after recording
    the findings in the status) when the spec cannot be served, client.ApiError on API failures."""
    now = now or _now()
    meta = body["metadata"]
    ns = meta["namespace"]
    validation = validate(manifest_of(body),
                          read_config_map=lambda cm, k: client.read_config_map_key(ns, cm, k))
    outcome = Outcome()
    bounded = None
    if validation.ok:
        dep = validation.deployment
        assert dep is not None
        asks = roles.asks(dep, children, meta["uid"])
        bounded = scaling.bound({role: asks[role].requested for role in ROLES}, dep.spec.scaling)
        validation = with_instances(validation, bounded.effective)
    if not validation.ok:
        observed = status_mod.Observed(children=children, pods=pods)
        _write_status(client, body, validation, observed, now, outcome)
        raise InvalidSpec(" ".join(f.line() for f in validation.errors))
    assert bounded is not None
    desired, rolling = _desired(validation, body, pods)
    the_plan = plan(desired, children, meta["uid"])
    drains = _drains(client, validation, body, desired, children, pods, now)
    the_plan = replace(the_plan, prune=[o for o in the_plan.prune if not drain.held(o, drains)])
    try:
        children = _apply(client, ns, the_plan, children, asks, outcome)
    except NotServed as err:
        _report_not_served(client, body, validation, children, pods, err, now, outcome)
        raise
    _report_drained(client, body, validation, drains, outcome.pruned)
    draining = [d for d in drains if not d.done]
    if draining:
        outcome.requeue_after = drain.RECHECK_S
    decisions = _group_restarts(client, body, children, pods, now, outcome)
    gone = {pod for d in decisions if d.action in ("restart", "replace") for pod in d.pods}
    pods = [p for p in pods if p["metadata"]["name"] not in gone]
    observed = status_mod.Observed(children=children, pods=pods, foreign=the_plan.foreign,
                                   blocked=the_plan.blocked, rolling=rolling, restarts=decisions,
                                   links=_kv_links(client, validation, pods, body.get("status") or {}),
                                   scaling=bounded, draining=[d.status() for d in draining])
    _write_role_statuses(client, validation, observed, meta["uid"], now, outcome)
    _write_status(client, body, validation, observed, now, outcome)
    if outcome.applied or outcome.pruned or outcome.restarted:
        logger.info("Reconciled %s/%s: applied %s, pruned %s, restarted %s", ns, meta["name"],
                    _names(outcome.applied), _names(outcome.pruned), outcome.restarted,
                    extra={"object": f"{ns}/{meta['name']}"})
    return outcome

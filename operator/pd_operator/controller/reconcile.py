"""The one level-based reconcile of a PDDeployment: every trigger (create, update, resume, the
drift timer, a child's change) runs the same steps, so the outcome never depends on which one.

validate (its image check renders each role's pod template and revision once, render/workloads.py
Templates, which every later step takes) -> (invalid: the steps below go on with the last valid spec
(controller/last_valid.py) and the status says why; none recorded: status + event, children
untouched) -> the
instance counts the roles' PDRoles ask for, held at spec.scaling's bounds (controller/pdroles.py,
spec/scaling.py) -> the rollout's figures and next step (controller/rollout.py: which outdated
instances leave, how many surge, its progress clock) -> render those -> gate the proxy (instances
not Ready or not linked, or leaving) -> drain what leaves (controller/drain.py) -> keep every
instance's StatefulSet on its own revision but those the rollout replaces now, recording each
(controller/revisions.py pin) -> plan against the observed children -> hold the instances a
scale-down removed until they drained, the revision configs a pod or StatefulSet still mounts and
the instances' revision records (controller/revisions.py) -> apply what changed (a missing PDRole
is created with its count, a changed spec.<role>.replicas forwarded; a child not seen among ours is
first read by name, and an object found there that this PDDeployment does not own is left untouched
and named in the status: never adopted) -> prune what the spec no longer wants -> replace the pods
of the instances the rollout took out once drained -> group restarts -> status of the PDRoles and
the PDDeployment (written only when it changed) -> events on significant transitions
(controller/events.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar

from pd_operator.api.conditions import KV_COMPATIBLE, READY
from pd_operator.api.labels import INSTANCE, REVISION, ROLE
from pd_operator.api.types import ROLES
from pd_operator.controller import (
    drain,
    events,
    gate,
    last_valid,
    links,
    pdroles,
    restarts,
    revisions,
    rollout,
)
from pd_operator.controller import status as status_mod
from pd_operator.controller.client import Client, NotServed, concurrently
from pd_operator.controller.diff import Diff, diff, differs, is_owned_by, key, stamp
from pd_operator.controller.pods import by_instance, is_terminating, label
from pd_operator.controller.proxy_state import ProxyStateReader, ProxyUnreachable
from pd_operator.names import Names
from pd_operator.proxy.membership import KEY
from pd_operator.render import Boundary, Prefixes, Routable, render, tools, workloads
from pd_operator.render.policy import CHART_DEFAULT, admin_token
from pd_operator.render.proxy import COMPONENT as PROXY
from pd_operator.render.proxy import membership_document
from pd_operator.render.runnable import check
from pd_operator.render.workloads import Templates
from pd_operator.serving_image.contents import DEFAULT_TOOLS_IMAGE
from pd_operator.spec import scaling
from pd_operator.spec.host_paths import DEFAULT, HostPathPolicy
from pd_operator.spec.node_access import DEFAULT as NO_NODE_ACCESS
from pd_operator.spec.node_access import NodeAccess
from pd_operator.spec.validate import Resolved, Validation, with_instances

logger = logging.getLogger(__name__)
T = TypeVar("T")


LATER_WAVES = ({"RoleBinding"}, {"ControllerRevision"}, {"StatefulSet", "Deployment"})
"""Kinds applied after the others, a wave after another (see _apply): a RoleBinding once its Role
exists (the API server's escalation check reads the Role: binding a missing one is refused), an
instance's revision record once all else its StatefulSet's pods need was applied (a PodGroup kind
the cluster does not serve stops the apply before it: an instance never applied is on no revision,
so it takes the spec's, not a record's PodGroup the cluster lacks), the pods' workloads last."""


class InvalidSpec(Exception):
    """The spec cannot be served; retrying will not help until the user changes it."""


@dataclass
class Outcome:
    applied: list[dict] = field(default_factory=list)
    """Children as the API server returned them from this reconcile's writes (applies, annotations)."""
    pruned: list[dict] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    """Instances whose pods a rollout deleted (after their drain) to recreate them from the new template."""
    replaced_keys: list[tuple[str, int]] = field(default_factory=list)
    deleted_pods: list[str] = field(default_factory=list)
    """The uids of the pods this reconcile deleted (a rollout's replacement, a group restart): the
    runner keeps them out of the next reconciles until its index shows them going."""
    taken: list[dict] = field(default_factory=list)
    """Objects found under a child's name that this PDDeployment does not own: not applied."""
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


def _running_tools(children: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """Per role, the (tools image, revision) of each instance's StatefulSet as it is now."""
    out: dict[str, list[tuple[str, str]]] = {}
    for obj in children:
        if obj.get("kind") != "StatefulSet":
            continue
        template = (obj.get("spec") or {}).get("template") or {}
        revision = ((template.get("metadata") or {}).get("labels") or {}).get(REVISION)
        image = next((c.get("image") for c in (template.get("spec") or {}).get("initContainers") or []
                      if c.get("name") == tools.INIT_CONTAINER), None)
        if revision and image:
            out.setdefault(label(obj, ROLE) or "", []).append((image, revision))
    return out


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _render(resolved: Resolved, rendered: Templates, the_plan: rollout.Plan, routable: Routable,
            own: Prefixes, boundary: Boundary) -> list[dict]:
    """The spec's manifests: its instances plus the rollout's surge, the membership `routable` (its
    prefills on another revision with their `own` prefix routing), every instance on its role's
    current template (revisions.pin then keeps each on its own)."""
    surge: dict[str, set[int]] = {
        role: {i for i in the_plan.instances[role] if i >= resolved.role(role).replicas} for role in ROLES}
    return render(resolved, routable=routable, boundary=boundary, surge=surge, rendered=rendered, own=own)


def _apply(client: Client, namespace: str, the_diff: Diff, children: list[dict], asks: dict[str, pdroles.Ask],
           owner_uid: str, outcome: Outcome) -> list[dict]:
    """Apply (a missing PDRole: create it with its count), forward, prune; the children afterwards.
    A child not among `children` (the objects with our labels) may still exist under its name: a
    same-named object of someone else, which a forced apply would take over (its rules, subjects or
    data rewritten, an owner reference added so that deleting the PDDeployment deletes it). So it
    is read first and, unless this PDDeployment owns it (our own write the watch has not shown yet),
    left as it is (outcome.taken). Between that read and the apply the name could still be taken by
    a create of another writer; nothing but the API server's own create can close that window, and
    an apply cannot ask for it.
    The reads go out at once, then the writes in waves, each at once (client.concurrently): the
    RoleBindings after their Roles, the instances' revision records, the pods' StatefulSets and
    Deployments last, once what their pods need exists (their ServiceAccount, ConfigMaps, PodGroups,
    RoleBindings, and the NetworkPolicies that fence them)."""
    current = {key(c): c for c in children}
    unseen = [m for m in the_diff.apply if key(m) not in current]
    taken = set()
    for manifest, existing in zip(unseen, concurrently(client.get_child, unseen), strict=True):
        if existing is not None and not is_owned_by(existing, owner_uid):
            outcome.taken.append({"apiVersion": manifest["apiVersion"], "kind": manifest["kind"], **existing})
            taken.add(key(manifest))
        elif existing is not None:
            current[key(manifest)] = existing

    def write(manifest: dict) -> dict:
        if pdroles.is_role(manifest) and key(manifest) not in current:
            ask = asks[manifest["spec"]["role"]]
            return client.create_role(pdroles.creation(manifest, ask.requested))
        return client.apply(manifest)

    todo = [m for m in the_diff.apply if key(m) not in taken]
    later = set().union(*LATER_WAVES)
    waves = [[m for m in todo if m["kind"] not in later],
             *([m for m in todo if m["kind"] in kinds] for kinds in LATER_WAVES)]
    for wave in waves:
        for manifest, applied in zip(wave, concurrently(write, wave), strict=True):
            current[key(manifest)] = applied
            outcome.applied.append(applied)
    forwards = [ask for ask in asks.values() if ask.forward]
    for forwarded in concurrently(
            lambda ask: client.forward_replicas(namespace, ask.name, pdroles.forward_patch(ask.requested)),
            forwards):
        current[key(forwarded)] = forwarded
        outcome.applied.append(forwarded)
    concurrently(client.delete, the_diff.prune)
    for obj in the_diff.prune:
        current.pop(key(obj), None)
        outcome.pruned.append(obj)
    return list(current.values())


def _live(pods: list[dict], role: str) -> dict[str, str]:
    """The running, not terminating pods of `role` with an address, by name -> IP (a pod not running
    yet loads the current membership when it starts), decode pods only with a KV-link gate."""
    out = {}
    for pod in pods:
        st = pod.get("status") or {}
        if label(pod, ROLE) == role and not is_terminating(pod) and st.get("podIP") \
                and st.get("phase") == "Running" and (role != "decode" or links.gated(pod)):
            out[pod["metadata"]["name"]] = st["podIP"]
    return out


def _read_proxies(proxies: ProxyStateReader, resolved: Resolved, pods: list[dict], token: str | None
                  ) -> list[drain.ProxyRead] | None:
    """Every live proxy pod's state (None: no proxy routes to the instances)."""
    proxy = resolved.deployment.spec.proxy
    if not proxy.enabled:
        return None
    targets = {name: (ip, proxy.admin_port) for name, ip in _live(pods, PROXY).items()}
    return [drain.ProxyRead(*heard) for heard in _heard(proxies.read_all(targets, token))]


def _push_gates(proxies: ProxyStateReader, pods: list[dict], document: dict) -> list[drain.GateRead]:
    """Hand every live decode pod's KV-link gate the membership `document`; their answers."""
    return [drain.GateRead(*heard) for heard in _heard(proxies.push_all(_live(pods, "decode"), document))]


def _heard(answers: Mapping[str, T | ProxyUnreachable]) -> list[tuple[str, T | None, str]]:
    """(pod, its answer or None, why none) for every pod dialled but those that refused the
    connection: no proxy or gate process listens there, so it routes, carries and links nothing."""
    return [(name, None, str(a)) if isinstance(a, ProxyUnreachable) else (name, a, "")
            for name, a in answers.items() if not (isinstance(a, ProxyUnreachable) and a.refused)]


def _drains(proxies: ProxyStateReader, resolved: Resolved, body: dict, leaving: dict[drain.Instance, str],
            pods: list[dict], gates: list[drain.GateRead], now: datetime, token: str | None
            ) -> list[drain.Drain]:
    """The drain of every instance in `leaving` (see controller/drain.py); `gates`: the decode pods'
    gates after this reconcile's push; `token`: what the proxies' admin port wants."""
    if not leaving:
        return []
    previous = (body.get("status") or {}).get("draining") or []
    reads = _read_proxies(proxies, resolved, pods, token)
    return drain.drains(resolved, leaving, previous, reads, gates, now)


def _leaving(resolved: Resolved, body: dict, children: list[dict], the_plan: rollout.Plan
             ) -> dict[drain.Instance, str]:
    """Every instance a scale-down removed or the rollout takes out."""
    leaving = drain.departing(children, body["metadata"]["uid"], the_plan.instances)
    leaving |= {(role, index): resolved.names.instance(role, index) for role, index in the_plan.leave
                if role in ROLES}
    return leaving


def _gates(proxies: ProxyStateReader, resolved: Resolved, body: dict, manifests: list[dict],
           children: list[dict], leaving: dict[drain.Instance, str], pods: list[dict], routable: Routable,
           own: Prefixes, pairs: Mapping[str, str]) -> list[drain.GateRead]:
    """Push the membership to the decode pods' gates when it changed or a prefill instance drains
    (their mounted file follows up to a minute late; each reconcile of a drain pushes again to a
    gate still behind). Nothing otherwise: a steady deployment dials no pod. The document is the
    rendered membership ConfigMap's (without the proxy, none is rendered: the routable set's)."""
    name = resolved.names.proxy_membership
    def named(objs: list[dict]) -> dict | None:
        return next((o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name), None)
    rendered, current = named(manifests), named(children)
    changed = rendered is not None and (current is None or differs(stamp(rendered, body), current))
    if not changed and not any(role == "prefill" for role, _ in leaving):
        return []
    document = (json.loads(rendered["data"][KEY]) if rendered
                else membership_document(resolved, routable, own, pairs))
    return _push_gates(proxies, pods, document)


def _replacing(drains: list[drain.Drain], the_plan: rollout.Plan) -> set[rollout.Key]:
    """The instances the rollout took out that drained: their pods are replaced in this reconcile."""
    return {(d.role, d.index) for d in drains if d.done and (d.role, d.index) in the_plan.leave}


def _replace(client: Client, body: dict, resolved: Resolved, revisions: Mapping[str, str],
             drains: list[drain.Drain], replacing: set[rollout.Key], pods: list[dict], outcome: Outcome
             ) -> None:
    """Delete the pods of every instance in `replacing`: its StatefulSet (OnDelete), written with the
    current template in this reconcile (revisions.pin), recreates them from it."""
    ns = resolved.deployment.namespace
    groups = by_instance(pods)
    for d in drains:
        if (d.role, d.index) not in replacing:
            continue
        members = groups.get((d.role, d.index), [])
        for pod in members:
            client.delete_pod(ns, pod["metadata"]["name"], pod["metadata"]["uid"])
            outcome.deleted_pods.append(pod["metadata"]["uid"])
        old = sorted({label(p, REVISION) or "none" for p in members})
        client.post_event(body, *events.replaced(d, old, revisions[d.role],
                                                 int(drain.bound(resolved, d.role).total_seconds())))
        outcome.replaced.append(d.name)
        outcome.replaced_keys.append((d.role, d.index))


def _report_drained(client: Client, body: dict, resolved: Resolved, drains: list[drain.Drain],
                    pruned: list[dict]) -> None:
    gone = {o["metadata"]["name"] for o in pruned if o["kind"] == "StatefulSet"}
    for d in drains:
        if d.name in gone:
            client.post_event(body, *events.deleted(d, int(drain.bound(resolved, d.role).total_seconds())))


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
                    outcome.deleted_pods.append(pod["metadata"]["uid"])
            outcome.restarted.append(decision.instance)
        if decision.action != "none":
            decisions.append(decision)
    return decisions


def _report_not_served(client: Client, body: dict, validation: Validation, children: list[dict],
                       pods: list[dict], figures: rollout.Figures, routable: Routable, err: NotServed,
                       now: datetime, outcome: Outcome, refused: Validation | None) -> None:
    """The cluster does not serve a child's kind (a PodGroup of spec.scheduling.gang without its API
    or CRD): the apply stopped there, before the StatefulSets. Say so in the status, then let the
    error go up (logged on one line; the drift loop retries, so installing the API is enough)."""
    observed = status_mod.Observed(children=children, pods=pods, unserved=err.manifest,
                                   unserved_error=str(err), routable=routable, figures=figures,
                                   refused=refused)
    _write_status(client, body, validation, observed, now, outcome)


def _kv_links(proxies: ProxyStateReader, resolved: Resolved, pods: list[dict], previous: dict,
              gates: list[drain.GateRead], sizes: revisions.Sizes) -> list[dict]:
    """status.kvLinks: the figures of a link that changed state from its gate's last round (this
    reconcile's push answer, else read from the gate's probe port)."""
    namespace, name = resolved.deployment.namespace, resolved.deployment.name
    answered = {g.pod: g.state for g in gates if g.state is not None}
    addresses = _live(pods, "decode")

    def read(pod: str) -> dict | None:
        if pod in answered:
            return answered[pod].round
        if pod not in addresses:
            return None
        try:
            return proxies.gate(addresses[pod]).round
        except ProxyUnreachable as err:  # the figures only; the link state comes from the pod's readiness
            logger.info("Cannot read the KV-link gate of %s/%s: %s", namespace, pod, err,
                        extra={"object": f"{namespace}/{name}"})
            return None

    return links.link_status(resolved, pods, previous.get("kvLinks") or [], read, sizes)


def _write_status(client: Client, body: dict, validation: Validation, observed: status_mod.Observed,
                  now: datetime, outcome: Outcome) -> None:
    meta = body["metadata"]
    previous = body.get("status") or {}
    new = status_mod.status(validation, observed, previous, meta.get("generation"),
                            now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    conditions = {c["type"]: c["status"] for c in new["conditions"]}
    outcome.ready = conditions.get(READY) == "True"
    outcome.kv_compatible = conditions.get(KV_COMPATIBLE) == "True"
    if new == previous:
        return
    client.patch_status(meta["namespace"], meta["name"], status_mod.merge_patch(previous, new))
    for event in events.transitions(previous.get("conditions") or [], new["conditions"]):
        client.post_event(body, *event)


def _write_role_statuses(client: Client, resolved: Resolved, observed: status_mod.Observed,
                         bounded: scaling.Bounded, uid: str, now: datetime, outcome: Outcome) -> None:
    """Each owned PDRole's status (what its scale subresource reports), written when it changed."""
    assert observed.figures is not None, "the reconcile computes the figures of a valid spec"
    figures = observed.figures
    holds = {h.role: h for h in bounded.holds}
    names = resolved.names
    changed = []
    for role in ROLES:
        found = pdroles.find(observed.children, names.role(role))
        if found is None or not is_owned_by(found, uid):
            continue
        previous = found.get("status") or {}
        draining = sum(1 for d in observed.draining or [] if d["role"] == role)
        new = pdroles.status(resolved, role, bounded.effective[role], figures[role], draining,
                           holds.get(role), previous, found["metadata"].get("generation"),
                           now.strftime("%Y-%m-%dT%H:%M:%SZ"))
        if new != previous:
            changed.append((names.role(role), new))
    outcome.applied += concurrently(
        lambda change: client.patch_role_status(resolved.deployment.namespace, *change), changed)


def reconcile(client: Client, proxies: ProxyStateReader, body: dict, children: list[dict], pods: list[dict],
              now: datetime | None = None, host_path_policy: HostPathPolicy = DEFAULT,
              tools_image: str = DEFAULT_TOOLS_IMAGE, boundary: Boundary = CHART_DEFAULT,
              node_access: NodeAccess = NO_NODE_ACCESS) -> Outcome:
    """Bring the children of one PDDeployment to its spec. `children` and `pods` are the objects
    carrying its `pd.serving.dev/deployment` label, as observed. A spec that cannot be served is
    reported in the status and what runs goes on with the last valid spec; without one, raises
    InvalidSpec (after recording the findings in the status); client.ApiError on API failures."""
    now = now or _now()
    meta = body["metadata"]
    ns = meta["namespace"]
    options = {"read_config_map": lambda cm, k: client.read_config_map_key(ns, cm, k),
               "host_path_policy": host_path_policy, "tools_image": tools_image, "node_access": node_access}
    checked = check(manifest_of(body), **options)
    served, refused = body.get("spec") or {}, None
    if checked.validation.resolved is None and (kept := last_valid.recorded(
            children, Names(meta["name"], ns).last_valid_spec, meta["uid"])) is not None:
        fallback = check({**manifest_of(body), "spec": kept}, **options)
        if fallback.validation.resolved is not None:  # what runs goes on with it; the status says why
            served, refused, checked = kept, checked.validation, fallback
            logger.warning("Refused the spec of %s/%s, serving the last valid one: %s", ns, meta["name"],
                           " ".join(f.line() for f in refused.errors),
                           extra={"object": f"{ns}/{meta['name']}"})
    validation, rendered = checked.validation, checked.templates
    outcome = Outcome()
    if validation.resolved is not None:
        asks = pdroles.asks(validation.resolved, children, meta["uid"])
        bounded = scaling.bound({role: asks[role].requested for role in ROLES},
                                validation.resolved.deployment.spec.scaling)
        scaled = with_instances(validation, bounded.effective)
        if scaled is not validation:  # other counts: the templates may differ (spec.placement spreads)
            validation = scaled
            rendered = workloads.templates(scaled.resolved) if scaled.resolved is not None else None
    resolved = validation.resolved
    if resolved is None or rendered is None:
        observed = status_mod.Observed(children=children, pods=pods)
        _write_status(client, body, validation, observed, now, outcome)
        raise InvalidSpec(" ".join(f.line() for f in validation.errors))
    rendered = workloads.with_running(resolved, rendered, _running_tools(children),
                                      revisions.decode_blocks(resolved, children))
    previous = body.get("status") or {}
    leaving = {d.get("name") for d in previous.get("draining") or []}
    history = revisions.records(children, pods, meta["uid"])
    runs = revisions.running(history, pods)
    sizes = revisions.pods_per_instance(runs)
    state = gate.observe(resolved, rendered.revisions, pods, leaving, sizes, rendered.pairs)
    figures = rollout.figures(resolved, rendered.revisions, pods, sizes)
    moving = rollout.step(resolved, state, figures, previous, now, meta.get("generation"),
                          rendered.paired(resolved.layout_hash))
    routable = moving.plan.routable(moving.state)
    own = gate.own_prefixes(resolved, runs, moving.state, routable)
    manifests = [*_render(resolved, rendered, moving.plan, routable, own, boundary),
                 last_valid.record(resolved, served)]
    departing = _leaving(resolved, body, children, moving.plan)
    gates = _gates(proxies, resolved, body, manifests, children, departing, pods, routable, own,
                   rendered.pairs)
    drains = _drains(proxies, resolved, body, departing, pods, gates, now, admin_token(boundary, resolved))
    replacing = _replacing(drains, moving.plan)
    pinned = revisions.pin(resolved, manifests, history, rendered.revisions, replacing)
    desired = [stamp(pdroles.applied_form(m), body) for m in pinned]
    the_diff = diff(desired, children, meta["uid"])
    used = revisions.in_use(children, pods)
    records = revisions.kept_records(history, pods, desired, {
        role: resolved.role(role).rollout.revision_history_limit for role in ROLES})
    the_diff = replace(the_diff, prune=[o for o in the_diff.prune if not drain.held(o, drains)
                                        and not revisions.kept(o, used)
                                        and o["metadata"]["name"] not in records])
    try:
        children = _apply(client, ns, the_diff, children, asks, meta["uid"], outcome)
    except NotServed as err:
        _report_not_served(client, body, validation, children, pods, figures, routable, err, now, outcome,
                           refused)
        raise
    _report_drained(client, body, resolved, drains, outcome.pruned)
    _replace(client, body, resolved, rendered.revisions, drains, replacing, pods, outcome)
    draining = [d for d in drains if not d.done]
    outcome.requeue_after = drain.RECHECK_S if draining else moving.recheck_after(now)
    decisions = _group_restarts(client, body, children, pods, now, outcome)
    gone = {pod for d in decisions if d.action in ("restart", "replace") for pod in d.pods}
    remaining = [p for p in pods
                 if p["metadata"]["name"] not in gone and drain.instance_of(p) not in outcome.replaced_keys]
    # An instance replaced is on the current revision now: the spec's pods per instance, not its old pods'.
    sizes = {inst: count for inst, count in sizes.items() if inst not in outcome.replaced_keys}
    if len(remaining) != len(pods):  # the status reports the pods this pass left
        figures = rollout.figures(resolved, rendered.revisions, remaining, sizes)
    observed = status_mod.Observed(children=children, pods=remaining, foreign=the_diff.foreign,
                                   blocked=[*the_diff.blocked, *outcome.taken], rollout=moving,
                                   restarts=decisions,
                                   links=_kv_links(proxies, resolved, remaining, previous, gates, sizes),
                                   scaling=bounded, draining=[d.status() for d in draining],
                                   routable=routable, figures=figures, refused=refused, sizes=sizes)
    _write_role_statuses(client, resolved, observed, bounded, meta["uid"], now, outcome)
    _write_status(client, body, validation, observed, now, outcome)
    if outcome.applied or outcome.pruned or outcome.restarted or outcome.replaced:
        logger.info("Reconciled %s/%s: applied %s, pruned %s, restarted %s, replaced %s", ns, meta["name"],
                    _names(outcome.applied), _names(outcome.pruned), outcome.restarted, outcome.replaced,
                    extra={"object": f"{ns}/{meta['name']}"})
    return outcome

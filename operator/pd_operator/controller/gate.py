"""The proxy's gates: route only to instances that can serve, to a decode instance only over a
proven KV link, and never pair prefill and decode pods of different KV layouts. Pure.

Ready: an instance joins the membership once all its pods exist, are Ready and run one KV layout
(a new instance of a scale-up, one whose rank restarts, one a rollout replaced), and leaves it
while one is not.

KV link: the proxy lists only decode instances whose pods all report a working link to every
prefill instance of their layout (controller/links.py); a decode instance whose link breaks
leaves the list, and comes back when its gate passes again.

Rollout: an instance the rollout takes out (controller/rollout.py) leaves the membership before
its pods are replaced. Instance names (and so the proxy's upstreams) do not change when the KV
layout does, so each member carries the layout its pods run and the proxy pairs a prefill only
with a decode of the same layout (proxy/membership.py): old and new instances serve side by side,
never together. A prefill still on an older revision carries that revision's own prefix-cache block
and KV-events publishers, read from its revision record (own_prefixes), so prefix routing goes on
cutting its prompts where its own engines cache them.

The gate returns the routable set; the renderer writes the proxy's membership ConfigMap from it
(render/proxy.py), never its Deployment, so gating restarts no proxy pod. With no instance left for
a role the proxy stays up and answers 503 (its readiness fails, and status reports
ProxyReady=False/NoUpstreams).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pd_operator.api.labels import KV_LAYOUT, REVISION
from pd_operator.api.types import ROLES
from pd_operator.controller import rollout
from pd_operator.controller.links import link_ready
from pd_operator.controller.pods import by_instance, instance_ready, label
from pd_operator.controller.revisions import Key, Sizes, expected_pods
from pd_operator.proxy.membership import paired_as
from pd_operator.render import proxy
from pd_operator.render.proxy import Prefix, Routable
from pd_operator.spec.validate import Resolved


def observe(resolved: Resolved, revisions: Mapping[str, str], pods: list[dict], leaving: Iterable[str],
            sizes: Sizes | None = None, pairs: Mapping[str, str] | None = None
            ) -> dict[str, dict[int, rollout.InstanceState]]:
    """The rollout planner's view of every instance with live pods. `revisions`: each role's
    current one (render/workloads.py Templates); `leaving`: instance names that left the membership
    to be replaced (status.draining); `sizes`: the pods each instance runs when whole
    (controller/revisions.py pods_per_instance; None: the spec's shape); `pairs`: kv-layouts that
    pair as another (Templates.pairs)."""
    pairs = pairs or {}
    leaving = set(leaving)
    out: dict[str, dict[int, rollout.InstanceState]] = {role: {} for role in ROLES}
    for (role, index), members in by_instance(pods).items():
        ready = instance_ready(members, expected_pods(resolved, sizes, role, index)) and (
            role != "decode" or all(link_ready(p) for p in members))
        runs = label(members[0], KV_LAYOUT) or ""
        out[role][index] = rollout.InstanceState(
            updated=all(label(p, REVISION) == revisions[role] for p in members),
            ready=ready, layout=paired_as(pairs, runs),
            leaving=resolved.names.instance(role, index) in leaving and index < resolved.role(role).replicas,
            label=runs if runs in pairs else None)
    return out


def own_prefixes(resolved: Resolved, runs: Mapping[Key, dict],
                 state: Mapping[str, Mapping[int, rollout.InstanceState]], routable: Routable
                 ) -> dict[int, Prefix | None]:
    """Per routable prefill instance whose pods do not all run the spec's revision (`state`: observe's):
    prefix routing as its own revision's engines run it, read from the StatefulSet of the record its
    pods run (controller/revisions.py running; render/proxy.py recorded_prefix), None without one.
    So during a rollout that changes the block (a block size, prefix caching, a KV layout) the proxy
    cuts each prefill's prompts at its own engine's boundaries, never at the spec's nor a guessed one."""
    return {i: (proxy.recorded_prefix(resolved, i, rec["data"]["statefulSet"])
                if (rec := runs.get(("prefill", i))) is not None else None)
            for i in routable.get("prefill", {}) if not state["prefill"][i].updated}

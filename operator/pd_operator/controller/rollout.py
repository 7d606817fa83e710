"""The proxy's gates: route only to instances that can serve, to a decode instance only over a
proven KV link, and never pair prefill and decode pods of different KV layouts. Pure.

Ready: an instance joins the membership once all its pods exist and are Ready on the wanted KV
layout (a new instance of a scale-up, one whose rank restarts), and leaves it while one is not.

KV link: the proxy lists only decode instances whose pods all report a working link to every
prefill instance (controller/links.py); a decode instance whose link breaks leaves the list, and
comes back when its gate passes again.

Rollout: instance names (and so the proxy's upstreams) do not change when the KV layout does, so
while a layout change rolls through the StatefulSets the proxy could send a request from a
new-layout prefill to an old-layout decode. While any serving pod still carries another
`pd.serving.dev/kv-layout` than the wanted one, the proxy only lists instances whose pods are all
Ready on the wanted layout.

A gate edits the proxy's membership ConfigMap (render/proxy.py), never its Deployment, so gating
restarts no proxy pod. With no instance left for a role the proxy stays up and answers 503 (its
readiness fails, and status reports ProxyReady=False/NoUpstreams). When every instance passes both
gates the membership is exactly as rendered.
"""

from __future__ import annotations

import json

from pd_operator import membership
from pd_operator.api.types import ROLES
from pd_operator.controller.links import linked_instances
from pd_operator.controller.pods import by_instance, instance_ready, label
from pd_operator.names import Names
from pd_operator.render.labels import KV_LAYOUT, ROLE
from pd_operator.render.proxy import members as proxy_members
from pd_operator.render.proxy import membership_data


def is_rolling(pods: list[dict], layout_hash: str) -> bool:
    return any(label(p, KV_LAYOUT) not in (None, layout_hash)
               for p in pods if label(p, ROLE) in ROLES)


def ready_instances(pods: list[dict], expected_pods: dict[str, int], layout_hash: str
                    ) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {role: set() for role in ROLES}
    for (role, index), members in by_instance(pods).items():
        if instance_ready(members, expected_pods[role], layout_hash):
            out[role].add(index)
    return out


def restrict(config_map: dict, names: Names, allowed: dict[str, set[int]]) -> dict:
    """The proxy's membership ConfigMap listing only `allowed` instances (of those it lists)."""
    current = proxy_members(config_map)
    assert current is not None, "the rendered membership always parses"
    keep = {names.instance(role, i) for role in ROLES for i in allowed[role]}
    doc = membership.document(*([u for u in current.role(role) if u.name in keep] for role in ROLES))
    return {**json.loads(json.dumps(config_map)), "data": membership_data(doc)}


def gate(desired: list[dict], pods: list[dict], names: Names, expected_pods: dict[str, int],
         replicas: dict[str, int], layout_hash: str) -> tuple[list[dict], bool]:
    """(the desired manifests with the proxy gated, whether a layout roll is in progress)."""
    rolling = is_rolling(pods, layout_hash)
    ready = ready_instances(pods, expected_pods, layout_hash)
    linked = linked_instances(pods, expected_pods["decode"], replicas["decode"])
    allowed = {"prefill": ready["prefill"] & set(range(replicas["prefill"])),
               "decode": ready["decode"] & linked}
    if all(allowed[role] == set(range(replicas[role])) for role in ROLES):
        return desired, rolling
    out = [restrict(m, names, allowed)
           if m["kind"] == "ConfigMap" and m["metadata"]["name"] == names.proxy_membership else m
           for m in desired]
    return out, rolling

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

The gate returns the routable set; the renderer writes the proxy's membership ConfigMap from it
(render/proxy.py), never its Deployment, so gating restarts no proxy pod. With no instance left for
a role the proxy stays up and answers 503 (its readiness fails, and status reports
ProxyReady=False/NoUpstreams).
"""

from __future__ import annotations

from pd_operator.api.labels import KV_LAYOUT, ROLE
from pd_operator.api.types import ROLES
from pd_operator.controller.links import linked_instances
from pd_operator.controller.pods import by_instance, instance_ready, label
from pd_operator.render import Routable
from pd_operator.spec.validate import Resolved


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


def routable(resolved: Resolved, pods: list[dict]) -> tuple[Routable, bool]:
    """(the instances the proxy may route to, whether a layout roll is in progress)."""
    replicas, expected = resolved.replicas(), resolved.pods_per_instance()
    ready = ready_instances(pods, expected, resolved.layout_hash)
    linked = linked_instances(pods, expected["decode"], replicas["decode"])
    allowed = {"prefill": ready["prefill"] & set(range(replicas["prefill"])),
               "decode": ready["decode"] & linked}
    return allowed, is_rolling(pods, resolved.layout_hash)

"""The proxy's gates: route to a decode instance only over a proven KV link, and never pair
prefill and decode pods of different KV layouts. Pure.

KV link: the proxy lists only decode instances whose pods all report a working link to every
prefill instance (controller/links.py); a decode instance whose link breaks leaves the list, and
comes back when its gate passes again.

Rollout: instance names (and so the proxy's host lists) do not change when the KV layout does, so
while a layout change rolls through the StatefulSets the proxy could send a request from a
new-layout prefill to an old-layout decode. While any serving pod still carries another
`pd.serving.dev/kv-layout` than the wanted one, the proxy only lists instances whose pods are all
Ready on the wanted layout.

With no instance left for a role the proxy is scaled to zero (nothing correct to route to). When
every instance passes both gates the proxy is exactly as rendered.
"""

from __future__ import annotations

import json

from pd_operator.api.types import ROLES
from pd_operator.controller.links import linked_instances
from pd_operator.controller.pods import by_instance, instance_ready, label
from pd_operator.names import Names
from pd_operator.render.labels import KV_LAYOUT, ROLE

# The load-balance proxy's flags (vllm-ascend examples/disaggregated_prefill_v1, facts.md section 2).
HOST_FLAGS = {"prefill": ("--prefiller-hosts", "--prefiller-ports"),
              "decode": ("--decoder-hosts", "--decoder-ports")}


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


def _keep(argv: list[str], flag: str, keep: list[bool]) -> list[str]:
    """Drop the values after `flag` (up to the next flag) where `keep` is False."""
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    values = [v for v, k in zip(argv[start:end], keep, strict=True) if k]
    return [*argv[:start], *values, *argv[end:]]


def restrict(proxy: dict, names: Names, allowed: dict[str, set[int]], replicas: dict[str, int]) -> dict:
    """The proxy Deployment routing only to `allowed` instances (scaled to 0 if a role has none)."""
    out = json.loads(json.dumps(proxy))
    if not all(allowed[role] for role in ROLES):
        out["spec"]["replicas"] = 0
        return out
    container = out["spec"]["template"]["spec"]["containers"][0]
    argv = container["command"]
    for role in ROLES:
        hosts_flag, ports_flag = HOST_FLAGS[role]
        wanted = {names.pod_host(role, i, 0) for i in allowed[role]}
        start = argv.index(hosts_flag) + 1
        keep = [h in wanted for h in argv[start:start + replicas[role]]]
        argv = _keep(_keep(argv, hosts_flag, keep), ports_flag, keep)
    container["command"] = argv
    return out


def gate(desired: list[dict], pods: list[dict], names: Names, expected_pods: dict[str, int],
         replicas: dict[str, int], layout_hash: str) -> tuple[list[dict], bool]:
    """(the desired manifests with the proxy gated, whether a layout roll is in progress)."""
    rolling = is_rolling(pods, layout_hash)
    allowed = {"prefill": set(range(replicas["prefill"])),
               "decode": linked_instances(pods, expected_pods["decode"], replicas["decode"])}
    if rolling:
        ready = ready_instances(pods, expected_pods, layout_hash)
        allowed = {role: allowed[role] & ready[role] for role in ROLES}
    if all(allowed[role] == set(range(replicas[role])) for role in ROLES):
        return desired, rolling
    out = [restrict(m, names, allowed, replicas)
           if m["kind"] == "Deployment" and label(m, ROLE) == "proxy" else m for m in desired]
    return out, rolling

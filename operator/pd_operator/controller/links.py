"""The KV-link gate as the operator sees it. Pure: the caller passes the pods and what it read.

Every decode pod runs `pd-kv-probe gate` (render/kv_probe.py) in its `kv-link` container, whose
readinessProbe passes only while the gate is linked to every prefill instance it may be paired with
(transfer/gate_state.py: after its first linked round, until FAILURE_THRESHOLD rounds in a row fail).
So the verdict travels the way Kubernetes already carries readiness: the kubelet probes the container
and writes `containerStatuses[kv-link].ready`, and the operator reads it from the pods it watches
anyway. The figures of a link (latency, Gbps) are the gate's last round, which the gate serves on its
probe port with its state; the operator reads them there (controller/proxy_state.py, bounded) only
when a link changes state, or takes them from its own membership push of that reconcile, so a steady
deployment costs no request. (No pod log is read: the operator needs no `pods/log` permission.)

A decode instance is linked when every one of its pods exists and has a ready `kv-link`; the
proxy routes only to linked decode instances (controller/gate.py) and DecodeReady says which
are not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pd_operator.api.types import KVLinkStatus
from pd_operator.controller.pods import by_instance
from pd_operator.controller.revisions import Sizes, expected_pods
from pd_operator.render.kv_probe import CONTAINER
from pd_operator.spec.validate import Resolved

LINK_CONTAINER = CONTAINER["decode"]

RoundReader = Callable[[str], "dict | None"]
"""pod name -> the gate's last round, or None when it cannot be read. The reconcile passes one that
reads the gate's state on its probe port; link_status calls it only for changed links."""


def gated(pod: dict) -> bool:
    """The pod runs the KV-link gate."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(c.get("name") == LINK_CONTAINER for c in containers)


def link_ready(pod: dict) -> bool:
    """The pod's kv-link container is ready (a pod rendered without the gate counts as linked)."""
    if not gated(pod):
        return True
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(c.get("name") == LINK_CONTAINER and c.get("ready") is True for c in statuses)


def _leader(pods: list[dict]) -> dict | None:
    return min(pods, key=lambda p: p["metadata"]["name"], default=None)


def _number(value: object) -> float | None:
    """A figure of the gate's round, if it is a number (the round comes from the tenant's image)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _entry(decode: str, prefill: str, linked: bool, figures: Mapping | None) -> dict:
    """The status.kvLinks entry (api/types.py KVLinkStatus)."""
    figures = figures or {}
    errors = figures.get("errors") or []
    return KVLinkStatus(decode=decode, prefill=prefill, linked=linked,
                        latency_ms=_number(figures.get("latencyMs")), gbps=_number(figures.get("gbps")),
                        message=str(errors[0])[:300] if errors and not linked else None).to_wire()


def link_status(resolved: Resolved, pods: list[dict], previous: list[dict], read: RoundReader,
                sizes: Sizes | None = None) -> list[dict]:
    """One entry per (decode instance, prefill instance): linked, and the figures of the gate round
    that last changed it. An entry whose state did not change is carried over as it was, so a
    steady deployment's status does not move and nothing is read. `sizes`: the pods each instance
    runs when whole (controller/revisions.py; None: the spec's shape)."""
    dep, names = resolved.deployment, resolved.names
    before = {(e.get("decode"), e.get("prefill")): e for e in previous}
    groups = by_instance(pods)
    out = []
    for d in range(dep.spec.decode.replicas):
        members = groups.get(("decode", d), [])
        linked = (len(members) == expected_pods(resolved, sizes, "decode", d)
                  and all(link_ready(p) for p in members))
        decode = names.instance("decode", d)
        pairs = [(p, names.instance("prefill", p)) for p in range(dep.spec.prefill.replicas)]
        if all(before.get((decode, prefill), {}).get("linked") == linked for _, prefill in pairs):
            out += [before[(decode, prefill)] for _, prefill in pairs]
            continue
        leader = _leader(members)
        last = read(leader["metadata"]["name"]) if leader is not None and gated(leader) else None
        by_peer = {str(r.get("peer", "")).rsplit(":", 1)[0]: r for r in (last or {}).get("peers", [])}
        for p, prefill in pairs:
            out.append(_entry(decode, prefill, linked, by_peer.get(names.pod_host("prefill", p, 0))))
    return out

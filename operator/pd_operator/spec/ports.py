"""The ports one serving pod binds, and the rules they must follow.

From vllm-ascend (vllm-project/vllm-ascend: vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake/
base_scheduler.py and docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md
@ v0.30.0rc2): DP rank r's workers handshake on `kv_port + r*tp*pp + device`; the V2 scheduler side
channel of DP rank r is `kv_port + tp*dp*pp + r`; the AscendDirect transport listens in
`[20000, 20000 + npus_per_node*1000)`. Mooncake's P2P handshake RPC ports are drawn from 15000-17000
(MC_MIN_RPC_PORT..MC_MAX_RPC_PORT: kvcache-ai/Mooncake: mooncake-transfer-engine/src/config.cpp, read
by the libtransfer_engine.so of mooncake-transfer-engine-npu 0.3.11.post1).
"""

from __future__ import annotations

from dataclasses import dataclass

from pd_operator.findings import Finding
from pd_operator.spec.topology import InstanceShape

ASCEND_DIRECT_BASE = 20000
ASCEND_DIRECT_PER_NPU = 1000
HANDSHAKE_RPC = (15000, 17000)
DP_RPC_PORT = 13345  # --data-parallel-rpc-port, rendered explicitly (vLLM's default is 29550)
PROBE_PORT = 8090
PROBE_RANGE = "KV-link probe"  # bound by the probe sidecars (render/kv_probe.py), not by vLLM
PROBE_READY_PATH = "/ready"  # the decode gate's readiness endpoint on PROBE_PORT
MAX_PORT = 65535


@dataclass(frozen=True)
class PortRange:
    name: str
    start: int
    count: int
    field: str
    """The spec field that moves this range."""

    @property
    def end(self) -> int:
        """One past the last port."""
        return self.start + self.count

    def overlaps(self, lo: int, hi: int) -> bool:
        return self.start < hi and lo < self.end

    def __str__(self) -> str:
        last = self.end - 1
        return f"{self.name} ports ({self.start}" + (f"-{last})" if last != self.start else ")")


def kv_handshake(kv_port: int, plan: InstanceShape, ordinal: int) -> PortRange:
    per_rank = plan.tp * plan.pp
    return PortRange("KV handshake", kv_port + plan.start_rank(ordinal) * per_rank,
                     plan.dp_local * per_rank, "spec.kvTransfer.kvPort")


def side_channel(kv_port: int, plan: InstanceShape, ordinal: int) -> PortRange:
    return PortRange("KV side channel", kv_port + plan.tp * plan.dp * plan.pp + plan.start_rank(ordinal),
                     plan.dp_local, "spec.kvTransfer.kvPort")


def kv_events(events_port: int, plan: InstanceShape, ordinal: int) -> PortRange:
    """The KV-events publishers of a pod's DP ranks: vLLM offsets the endpoint's port by the DP rank
    (vllm-project/vllm: vllm/distributed/kv_events.py @ v0.34.0, `offset_endpoint_port`)."""
    return PortRange("KV events", events_port + plan.start_rank(ordinal), plan.dp_local,
                     "spec.proxy.routing.kvEventsPort")


def pod_ports(kv_port: int, serving_port: int, plan: InstanceShape, ordinal: int,
              events_port: int | None = None) -> list[PortRange]:
    """`events_port`: where the pod's KV-events publishers bind (precise prefix routing), or None."""
    ports = [PortRange("HTTP", serving_port, 1, "spec.servingPort"),
             PortRange(PROBE_RANGE, PROBE_PORT, 1, "the operator's port plan"),
             kv_handshake(kv_port, plan, ordinal), side_channel(kv_port, plan, ordinal)]
    if plan.dp > 1:
        ports.append(PortRange("DP RPC", DP_RPC_PORT, 1, "the operator's port plan"))
    if events_port is not None:
        ports.append(kv_events(events_port, plan, ordinal))
    return ports


def port_findings(role: str, kv_port: int, serving_port: int, plan: InstanceShape, npus_per_node: int,
                  events_port: int | None = None) -> list[Finding]:
    out: list[Finding] = []
    seen: set[str] = set()

    def add(code: str, field: str, message: str) -> None:
        if message not in seen:
            seen.add(message)
            out.append(Finding(code, "error", field, "", message))

    for ordinal in range(plan.pods):
        ranges = pod_ports(kv_port, serving_port, plan, ordinal, events_port)
        for i, a in enumerate(ranges):
            if a.end - 1 > MAX_PORT:
                add("PortOutOfRange", a.field, f"The {role} {a} run past {MAX_PORT}; lower {a.field}.")
            for b in ranges[i + 1:]:
                if a.overlaps(b.start, b.end):
                    movable = [f for f in dict.fromkeys((a.field, b.field)) if f.startswith("spec.")]
                    add("PortOverlap", movable[0] if movable else a.field,
                        f"On {role} pods the {a} overlap the {b}; move {' or '.join(movable)} so "
                        "they are disjoint.")
            if a.overlaps(*HANDSHAKE_RPC):
                add("PortInHandshakeRange", a.field,
                    f"The {role} {a} fall in Mooncake's P2P handshake RPC range "
                    f"{HANDSHAKE_RPC[0]}-{HANDSHAKE_RPC[1]}, so a random engine port could take them; "
                    "move them outside that range.")
            direct_end = ASCEND_DIRECT_BASE + npus_per_node * ASCEND_DIRECT_PER_NPU
            # vllm-ascend's PD connectors always use the ascend transport (AscendDirect).
            if a.overlaps(ASCEND_DIRECT_BASE, direct_end):
                add("PortInAscendDirectRange", a.field,
                    f"The {role} {a} fall in {ASCEND_DIRECT_BASE}-{direct_end - 1}, where the "
                    f"AscendDirect transport of {npus_per_node} NPUs listens; set "
                    f"spec.kvTransfer.kvPort to {direct_end} or more.")
    return out

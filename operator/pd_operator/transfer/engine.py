"""One Mooncake TransferEngine per process, opened the way the serving pods open it.

Facts this relies on (observed with mooncake-transfer-engine-non-cuda 0.3.13.post1): engine calls
return 0 or -1 and never raise; with `P2PHANDSHAKE` (the discovery vllm-ascend's PD connectors
hard-code: vllm-project/vllm-ascend: vllm_ascend/distributed/kv_transfer/utils/mooncake_transfer_engine.py
@ v0.30.0rc2) a peer's segment is named `host:rpc_port` (the rpc port is random in
MC_MIN_RPC_PORT..MC_MAX_RPC_PORT; kvcache-ai/Mooncake: docs/source/design/transfer-engine/index.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

P2P = "P2PHANDSHAKE"


class EngineError(RuntimeError):
    """The engine could not be opened or memory could not be registered."""


def quiet_logs() -> None:
    # "No RDMA devices found" and similar start-up lines are harmless on tcp.
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")


@dataclass
class Engine:
    raw: Any
    """mooncake.engine.TransferEngine"""
    segment: str
    """The name peers use to reach this engine."""

    def register(self, addr: int, nbytes: int) -> None:
        if nbytes <= 0:
            return  # degenerate storage of an empty component is never registered
        if self.raw.register_memory(addr, nbytes) != 0:
            raise EngineError(f"register_memory({addr:#x}, {nbytes}) failed on {self.segment}")

    def first_buffer(self, segment: str) -> int:
        """Base address of a peer's first registered buffer, learnt through metadata discovery."""
        return int(self.raw.get_first_buffer_address(segment))

    def read(self, segment: str, local: list[int], remote: list[int], lengths: list[int]) -> int:
        return int(self.raw.batch_transfer_sync_read(segment, local, remote, lengths))


def open_engine(local_hostname: str, protocol: str = "tcp", device: str = "") -> Engine:
    """An engine named after `local_hostname` (an IP) that finds peers by P2P handshakes."""
    quiet_logs()
    from mooncake.engine import TransferEngine  # lazy: only engine-hosting processes need it

    raw = TransferEngine()
    if raw.initialize(local_hostname, P2P, protocol, device) != 0:
        raise EngineError(f"TransferEngine.initialize({local_hostname!r}, {P2P!r}, {protocol!r}) failed")
    return Engine(raw, f"{local_hostname}:{raw.get_rpc_port()}")

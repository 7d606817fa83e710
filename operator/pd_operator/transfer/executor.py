"""Execute one decode rank's share of a transfer plan over Mooncake: decode pulls (pull mode).

What this must get right, from the engine's behaviour (observed with mooncake-transfer-engine-non-cuda
0.3.13.post1, tests/transfer):
- every call returns 0 or -1 and never raises, so every return code is checked;
- tcp does not check *local* bounds (a bad offset silently corrupts memory) and the target checks
  remote bounds only against its registered buffers, not against the region a run belongs to: both
  are checked here, for every entry, before anything is submitted;
- more than MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER (default 1024) entries in flight to one peer fail
  the batch, so the concurrent batches to one peer share that budget;
- a failed batch is not cancelled (later slices may land) and a read is idempotent, so a failed
  batch is bisected by re-reading its halves to name the run that fails;
- zero-length entries are rejected by the Ascend engine (E19999, the seed change) and zero-size
  components have degenerate storage: both are skipped, never submitted.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from pd_operator.kv.simulate import RegionKey
from pd_operator.kv.transfer_plan import RunSet, TransferPlan

Regions = Mapping[RegionKey, tuple[int, int]]
"""(group, component, layer) -> (registered base address, bytes) on one rank."""

DEFAULT_QUEUE_LIMIT = 1024
# Failures named per report; past that only counted, so a wholly bad plan still reports quickly.
MAX_NAMED_FAILURES = 16


class Reader(Protocol):
    """What the executor needs from an engine (transfer.engine.Engine)."""

    def read(self, segment: str, local: list[int], remote: list[int], lengths: list[int]) -> int: ...


def queue_limit() -> int:
    """The per-peer in-flight limit the engine in this process was started with."""
    return int(os.environ.get("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", DEFAULT_QUEUE_LIMIT))


@dataclass(frozen=True)
class Peer:
    prefill_rank: int
    segment: str
    regions: Regions


@dataclass(frozen=True)
class RunRef:
    """Where a run comes from: the pair, the group/component/layer and the run within its run set."""

    prefill_rank: int
    decode_rank: int
    group: str
    component: str
    layer: int
    run: int
    src: int
    dst: int
    length: int

    @classmethod
    def of(cls, rs: RunSet, layer: int, run: int) -> RunRef:
        return cls(rs.prefill_rank, rs.decode_rank, rs.group, rs.component, layer, run,
                   int(rs.src[run]), int(rs.dst[run]), int(rs.length[run]))


@dataclass(frozen=True)
class Failure:
    reason: str
    run: RunRef | None = None

    def to_dict(self) -> dict:
        return {"reason": self.reason, "run": asdict(self.run) if self.run else None,
                "message": str(self)}

    def __str__(self) -> str:
        if self.run is None:
            return self.reason
        r = self.run
        return (f"{self.reason}: prefill rank {r.prefill_rank} -> decode rank {r.decode_rank}, "
                f"{r.group}/{r.component} layer {r.layer} run {r.run} "
                f"(src={r.src} dst={r.dst} len={r.length})")


@dataclass(frozen=True)
class PullOptions:
    queue_limit: int = field(default_factory=queue_limit)
    streams_per_peer: int = 1
    """Concurrent batches per peer; they split the peer's queue budget."""
    max_batch: int | None = None
    """Cap on entries per batch (default: the stream's share of the queue budget)."""

    def batch_size(self) -> int:
        share = max(1, self.queue_limit // max(1, self.streams_per_peer))
        return min(share, self.max_batch) if self.max_batch else share


@dataclass
class PullReport:
    decode_rank: int
    entries: int = 0
    bytes: int = 0
    batches: int = 0
    skipped_zero: int = 0
    started: float = 0.0
    """time.monotonic() when the first batch was submitted (comparable across processes)."""
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    failed_count: int = 0
    not_submitted: int = 0

    @property
    def ok(self) -> bool:
        return self.failed_count == 0

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def fail(self, failure: Failure, count: int = 1) -> None:
        """Record `count` failures, naming this one while fewer than MAX_NAMED_FAILURES are named."""
        self.failed_count += count
        if len(self.failures) < MAX_NAMED_FAILURES:
            self.failures.append(failure)

    def to_dict(self) -> dict:
        return {"decodeRank": self.decode_rank, "ok": self.ok, "entries": self.entries,
                "bytes": self.bytes, "batches": self.batches, "skippedZero": self.skipped_zero,
                "seconds": round(self.seconds, 6), "gbps": round(self.gbps, 3),
                "failedCount": self.failed_count, "notSubmitted": self.not_submitted,
                "failures": [f.to_dict() for f in self.failures]}


@dataclass
class PeerEntries:
    """Flat entries to one peer (absolute addresses), with the run set, layer and run of each."""

    local: np.ndarray
    remote: np.ndarray
    length: np.ndarray
    runset: np.ndarray
    layer: np.ndarray
    run: np.ndarray

    def ref(self, plan: TransferPlan, i: int) -> RunRef:
        return RunRef.of(plan.runsets[int(self.runset[i])], int(self.layer[i]), int(self.run[i]))


def build_entries(plan: TransferPlan, decode_rank: int, local: Regions, peers: Mapping[int, Peer],
                  report: PullReport) -> dict[int, PeerEntries]:
    """Absolute addresses of every non-empty run, bounds-checked on both sides; failures go to the
    report. Layers of a run set become one flat list per peer, so a batch spans layers."""
    parts: dict[int, list[tuple[np.ndarray, ...]]] = {}
    for index, rs in enumerate(plan.runsets):
        if rs.decode_rank != decode_rank:
            continue
        keep = np.flatnonzero(rs.length > 0)
        report.skipped_zero += (len(rs.length) - len(keep)) * len(rs.layers)
        if not len(keep):
            continue
        peer = peers.get(rs.prefill_rank)
        for layer in rs.layers:
            key = (rs.group, rs.component, layer)
            first = RunRef.of(rs, layer, int(keep[0]))
            if peer is None:
                report.fail(Failure(f"no peer for prefill rank {rs.prefill_rank}", first), len(keep))
                continue
            if key not in local:
                report.fail(Failure(f"decode rank {decode_rank} has no region {key}", first), len(keep))
                continue
            if key not in peer.regions:
                report.fail(Failure(f"prefill rank {rs.prefill_rank} publishes no region {key}", first),
                            len(keep))
                continue
            src, dst, length = rs.src[keep], rs.dst[keep], rs.length[keep]
            (l_base, l_size), (r_base, r_size) = local[key], peer.regions[key]
            for what, off, size in (("local", dst, l_size), ("remote", src, r_size)):
                bad = np.flatnonzero((off < 0) | (off + length > size))
                if len(bad):  # the first bad run is named, the others counted
                    report.fail(Failure(f"{what} run out of the {size}-byte region {key}",
                                        RunRef.of(rs, layer, int(keep[bad[0]]))), len(bad))
            parts.setdefault(rs.prefill_rank, []).append(
                (l_base + dst, r_base + src, length, np.full(len(keep), index), np.full(len(keep), layer),
                 keep))
    return {rank: PeerEntries(*(np.concatenate(col).astype(np.int64) for col in zip(*cols, strict=True)))
            for rank, cols in parts.items()}


def pull(engine: Reader, plan: TransferPlan, decode_rank: int, local: Regions, peers: Mapping[int, Peer],
         options: PullOptions | None = None) -> PullReport:
    """Pull decode_rank's runs of the plan. Nothing is submitted if any entry fails its checks; after
    a failed batch no further batch is started."""
    options = options or PullOptions()
    report = PullReport(decode_rank)
    entries = build_entries(plan, decode_rank, local, peers, report)
    if not report.ok:
        report.not_submitted = sum(len(e.length) for e in entries.values())
        return report
    batch = options.batch_size()
    streams: list[tuple[int, PeerEntries, np.ndarray]] = []
    for rank, e in entries.items():
        # Each stream takes a contiguous share, so a peer never has more than queue_limit in flight.
        for share in np.array_split(np.arange(len(e.length)), max(1, options.streams_per_peer)):
            if len(share):
                streams.append((rank, e, share))
    stop = threading.Event()
    lock = threading.Lock()

    def run_stream(rank: int, e: PeerEntries, share: np.ndarray) -> None:
        segment = peers[rank].segment
        for start in range(0, len(share), batch):
            if stop.is_set():
                with lock:
                    report.not_submitted += len(share) - start
                return
            idx = share[start: start + batch]
            local_a, remote_a = e.local[idx].tolist(), e.remote[idx].tolist()
            length_a = e.length[idx].tolist()
            rc = _read(engine, segment, local_a, remote_a, length_a)
            with lock:
                report.batches += 1
                if rc == 0:
                    report.entries += len(idx)
                    report.bytes += int(e.length[idx].sum())
                    continue
            stop.set()
            at = _locate(engine, segment, local_a, remote_a, length_a)
            reason = (f"batch_transfer_sync_read returned {rc} for a {len(idx)}-entry batch from "
                      f"segment {segment}" + ("" if at is not None else "; no single run reproduced it"))
            with lock:
                # The whole batch is failed: a failed batch may have landed partly.
                report.fail(Failure(reason, e.ref(plan, int(idx[at or 0]))), len(idx))
                report.not_submitted += len(share) - start - len(idx)
            return

    report.started = time.monotonic()
    if len(streams) == 1:
        run_stream(*streams[0])
    elif streams:
        with ThreadPoolExecutor(len(streams)) as pool:
            for fut in [pool.submit(run_stream, *s) for s in streams]:
                fut.result()
    report.seconds = time.monotonic() - report.started
    return report


def _read(engine: Reader, segment: str, local: list[int], remote: list[int], lengths: list[int]) -> int:
    try:
        return engine.read(segment, local, remote, lengths)
    except Exception:  # a binding error must fail the batch, never escape as success or a hang
        return -1


def _locate(engine: Reader, segment: str, local: list[int], remote: list[int], lengths: list[int],
            max_steps: int = 24) -> int | None:
    """Index of one failing entry of a failed batch, by re-reading halves (reads are idempotent)."""
    lo, hi = 0, len(lengths)
    for _ in range(max_steps):
        if hi - lo == 1:
            return lo if _read(engine, segment, local[lo:hi], remote[lo:hi], lengths[lo:hi]) != 0 else None
        mid = (lo + hi) // 2
        if _read(engine, segment, local[lo:mid], remote[lo:mid], lengths[lo:mid]) != 0:
            hi = mid
        elif _read(engine, segment, local[mid:hi], remote[mid:hi], lengths[mid:hi]) != 0:
            lo = mid
        else:
            return None
    return None

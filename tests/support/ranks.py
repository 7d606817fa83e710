"""Simulated serving ranks for the transfer tests and bench/transfer.py: one process per rank, each
with its own Mooncake TransferEngine and one registered arena holding the rank's paged KV tensors,
and a `Pairing` of them (a prefill engine and one or more decode engines on loopback).

The parent drives a rank through `RankWorker.call(command, ...)`; commands run in the child and
their results come back over a pipe. Children are started with `spawn` and import mooncake there
(pd_operator/transfer/__init__.py). A rank can be re-laid out for another pairing without
re-registering memory.
Prefill ranks come first in the worker list, then each decode DP engine's TP ranks.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.simulate import UNWRITTEN, RegionKey, regions
from pd_operator.kv.transfer_plan import TransferPlan
from pd_operator.transfer import arena
from pd_operator.transfer.engine_requests import EngineRequest, pools, prefill_ranks
from pd_operator.transfer.executor import Peer, PullOptions, Regions, pull
from pd_operator.transfer.kv_content import PREFILL_BACKGROUND, Request, differences, write_request

LOOPBACK_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "ERROR"}


class WorkerError(RuntimeError):
    """A command failed in a rank process (the message carries the child's traceback)."""


class _Rank:
    """The child's state: engine, arena and the current layout."""

    def __init__(self, hostname: str, capacity: int):
        from pd_operator.transfer.engine import open_engine  # imports mooncake: child only

        self.engine = open_engine(hostname)
        # Untouched until filled: a benchmark touches only the bytes a plan moves (a 32k-token GLM
        # pool is ~1 GB a rank), tests fill the whole arena.
        self.memory = np.empty(capacity, dtype=np.uint8)
        self.engine.register(int(self.memory.ctypes.data), capacity)
        self.layout: SideLayout | None = None
        self.rank = 0
        self.pool = (0, 0)
        self.views: dict[RegionKey, np.ndarray] = {}

    def place(self, layout: SideLayout, rank: int, num_blocks: int, num_slots: int) -> Regions:
        self.layout, self.rank, self.pool = layout, rank, (num_blocks, num_slots)
        self.views = arena.carve(self.memory, regions(layout, rank, num_blocks, num_slots))
        return arena.addresses(self.views)

    def fill(self, background: int, requests: Sequence[Request]) -> None:
        assert self.layout is not None, "place() first"
        self.memory[:] = background
        for req in requests:
            write_request(self.layout, self.rank, self.views, req)

    def touch_plan(self, plan: TransferPlan, decode: bool, value: int) -> int:
        """Write `value` over every byte the plan reads from (prefill) or writes to (decode) this rank,
        so those pages exist before a timed pull, as a serving rank's KV memory does. Returns bytes."""
        touched = 0
        for rs in plan.runsets:
            if (rs.decode_rank if decode else rs.prefill_rank) != self.rank:
                continue
            offsets = rs.dst if decode else rs.src
            for layer in rs.layers:
                view = self.views[(rs.group, rs.component, layer)]
                for off, n in zip(offsets.tolist(), rs.length.tolist(), strict=True):
                    view[off: off + n] = value
                    touched += n
        return touched

    def touch_span(self, nbytes: int, value: int) -> None:
        self.memory[:nbytes] = value

    def verify(self, requests: Sequence[Request]) -> list[str]:
        assert self.layout is not None, "place() first"
        return differences(self.memory, self.views, self.layout, self.rank, self.pool, requests)

    def pull(self, plan: TransferPlan, decode_rank: int, peers: dict[int, Peer],
             options: PullOptions | None = None) -> dict:
        report = pull(self.engine, plan, decode_rank, arena.addresses(self.views), peers, options)
        return {**report.to_dict(), "started": report.started}

    def read_span(self, segment: str, remote: int, nbytes: int) -> dict:
        """One contiguous read into the arena: the ceiling a plan's runs are measured against."""
        began = time.monotonic()
        rc = self.engine.read(segment, [int(self.memory.ctypes.data)], [remote], [nbytes])
        return {"rc": rc, "started": began, "seconds": time.monotonic() - began, "bytes": nbytes}


def _serve(conn: Connection, hostname: str, capacity: int, env: dict[str, str]) -> None:
    os.environ.update(env)
    try:
        rank = _Rank(hostname, capacity)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", (rank.engine.segment, int(rank.memory.ctypes.data))))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        command, args, kwargs = message
        try:
            conn.send(("ok", getattr(rank, command)(*args, **kwargs)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


class RankWorker:
    """Parent-side handle of one rank process."""

    def __init__(self, hostname: str, capacity: int, env: dict[str, str] | None = None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, daemon=True,
                                   args=(child, hostname, capacity,
                                         {**LOOPBACK_ENV, **(env or {})}))
        self.process.start()
        child.close()
        self.segment = ""
        self.base = 0

    def ready(self, timeout: float = 60.0) -> RankWorker:
        self.segment, self.base = self._result(timeout)
        return self

    def send(self, command: str, *args: Any, **kwargs: Any) -> None:
        self.conn.send((command, args, kwargs))

    def _result(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise WorkerError(f"rank process {self.process.pid} did not answer within {timeout} s")
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise WorkerError(f"rank process {self.process.pid} exited ({self.process.exitcode})") from None
        if status != "ok":
            raise WorkerError(value)
        return value

    def result(self, timeout: float = 300.0) -> Any:
        return self._result(timeout)

    def call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        self.send(command, *args, **kwargs)
        return self.result()

    def close(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(OSError):  # the child may be gone already
                self.conn.send(None)
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def start_workers(count: int, capacity: int, env: dict[str, str] | None = None) -> list[RankWorker]:
    """Start `count` rank processes in parallel, each an engine on 127.0.0.1 (P2P handshakes give
    every one its own `127.0.0.1:<rpc port>` segment)."""
    workers = []
    try:
        for _ in range(count):
            workers.append(RankWorker("127.0.0.1", capacity, env))
        return [w.ready() for w in workers]
    except BaseException:
        for w in workers:
            w.close()
        raise


@dataclass
class Pairing:
    prefill_layout: SideLayout
    decode_layout: SideLayout
    prefill: list[RankWorker]
    decode: list[list[RankWorker]]
    """[decode engine][TP rank]"""
    peers: dict[int, Peer]

    @classmethod
    def place(cls, workers: Sequence[RankWorker], p: SideLayout, d: SideLayout, max_prompt: int,
              engines: int = 1) -> Pairing:
        d_tp = d.side.tensor_parallel
        need = prefill_ranks(p) + engines * d_tp
        if len(workers) < need:
            raise ValueError(f"the pairing needs {need} rank processes; {len(workers)} were given")
        (pb, ps), (db, ds) = pools(p, d, max_prompt, engines)
        prefill = list(workers[: prefill_ranks(p)])
        rest = workers[prefill_ranks(p):]
        decode = [list(rest[e * d_tp: (e + 1) * d_tp]) for e in range(engines)]
        for rank, w in enumerate(prefill):
            w.send("place", p, rank, pb, ps)
        for group in decode:
            for rank, w in enumerate(group):
                w.send("place", d, rank, db, ds)
        peers = {rank: Peer(rank, w.segment, w.result()) for rank, w in enumerate(prefill)}
        for w in _flat(decode):
            w.result()
        return cls(p, d, prefill, decode, peers)

    def load(self, reqs: Sequence[EngineRequest]) -> None:
        """Prefill holds every engine's request; decode memory is blank."""
        for w in self.prefill:
            w.send("fill", PREFILL_BACKGROUND, [r.prefill for r in reqs])
        for w in _flat(self.decode):
            w.send("fill", UNWRITTEN, [])
        for w in (*self.prefill, *_flat(self.decode)):
            w.result()

    def pull(self, plans: Sequence[TransferPlan], options: PullOptions | None = None) -> list[list[dict]]:
        """Every decode rank of every engine pulls at once; reports by [engine][rank]."""
        for group, plan in zip(self.decode, plans, strict=True):
            for rank, w in enumerate(group):
                w.send("pull", plan, rank, self.peers, options)
        return [[w.result() for w in group] for group in self.decode]

    def verify(self, reqs: Sequence[EngineRequest]) -> list[str]:
        for group, req in zip(self.decode, reqs, strict=True):
            for w in group:
                w.send("verify", [req.decode])
        return [f"decode engine {e}: {problem}" for e, group in enumerate(self.decode)
                for w in group for problem in w.result()]


def _flat(groups: list[list[RankWorker]]) -> list[RankWorker]:
    return [w for group in groups for w in group]


def span(reports: Sequence[dict]) -> tuple[int, float]:
    """(bytes, seconds from the first start to the last end) of reports from concurrent pulls."""
    start = min(r["started"] for r in reports)
    end = max(r["started"] + r["seconds"] for r in reports)
    return sum(r["bytes"] for r in reports), end - start


"""Simulated serving ranks: one process per rank, each with its own Mooncake TransferEngine and one
registered arena holding the rank's paged KV tensors.

The parent drives a rank through `RankWorker.call(command, ...)`; commands run in the child and
their results come back over a pipe. Children are started with `spawn` and import mooncake there
(facts.md section 4). A rank can be re-laid out for another pairing without re-registering memory.
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
from pd_operator.kv.plan import TransferPlan
from pd_operator.kv.simulate import UNWRITTEN, RegionKey, regions, write_prompt
from pd_operator.transfer import arena
from pd_operator.transfer.executor import Peer, PullOptions, Regions, pull

# What prefill memory holds outside any prompt: other requests' data, never the decode fill.
PREFILL_BACKGROUND = 0x5A
LOOPBACK_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "ERROR"}


class WorkerError(RuntimeError):
    """A command failed in a rank process (the message carries the child's traceback)."""


@dataclass(frozen=True)
class Request:
    """One request's cache on one side: its block table, state slot and prompt length."""

    blocks: np.ndarray
    slot: int
    prompt_tokens: int
    tag: int = 0
    """XORed into the request's content bytes, so two requests held by one prefill differ."""


def write_request(layout: SideLayout, rank: int, views: dict[RegionKey, np.ndarray], req: Request) -> None:
    """write_prompt, with the content bytes XORed by the request's tag. The content bytes are found
    by writing onto two different fills: they are the bytes that come out equal."""
    if req.tag == 0:
        write_prompt(layout, rank, views, req.blocks, req.slot, req.prompt_tokens)
        return
    low = {k: np.zeros_like(v) for k, v in views.items()}
    high = {k: np.full_like(v, 0xFF) for k, v in views.items()}
    for scratch in (low, high):
        write_prompt(layout, rank, scratch, req.blocks, req.slot, req.prompt_tokens)
    for key, view in views.items():
        content = low[key] == high[key]
        view[content] = low[key][content] ^ np.uint8(req.tag)


def differences(memory: np.ndarray, views: dict[RegionKey, np.ndarray], layout: SideLayout, rank: int,
                pool: tuple[int, int], requests: Sequence[Request]) -> list[str]:
    """Differences between an arena and a fresh arena in which this rank wrote the requests itself:
    wrong content, and any byte changed outside the content (the fresh arena holds UNWRITTEN)."""
    expected = np.full(len(memory), UNWRITTEN, dtype=np.uint8)
    expected_views = arena.carve(expected, regions(layout, rank, *pool))
    for req in requests:
        write_request(layout, rank, expected_views, req)
    if np.array_equal(expected, memory):
        return []
    problems = []
    base = int(memory.ctypes.data)
    covered = np.zeros(len(memory), dtype=bool)
    for key, view in views.items():
        bad = np.flatnonzero(view != expected_views[key])
        if len(bad):
            blank = int(np.count_nonzero(view[bad] == UNWRITTEN))
            problems.append(f"rank {rank} region {key}: {len(bad)} bytes differ ({blank} never written), "
                            f"first at offset {int(bad[0])}")
        start = int(view.ctypes.data) - base
        covered[start: start + len(view)] = True
    outside = np.flatnonzero((memory != expected) & ~covered)
    if len(outside):
        problems.append(f"rank {rank}: {len(outside)} bytes outside every region changed, "
                        f"first at arena offset {int(outside[0])}")
    return problems


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

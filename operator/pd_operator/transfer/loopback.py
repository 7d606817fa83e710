"""A prefill engine and one or more decode engines made of rank processes on loopback.

Prefill ranks come first in the worker list, then each decode DP engine's TP ranks. Every decode
engine pulls its own request from the one prefill engine; the requests live in different prefill
blocks and state slots and carry different tags, so a pull of the wrong request shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.plan import (
    DEFAULT_STATE_SLOT,
    TransferPlan,
    blocks_needed,
    plan_transfer,
    synthetic_blocks,
)
from pd_operator.kv.simulate import UNWRITTEN, regions
from pd_operator.transfer import arena
from pd_operator.transfer.executor import Peer, PullOptions
from pd_operator.transfer.ranks import PREFILL_BACKGROUND, RankWorker, Request

TAG_STEP = 0x5C


@dataclass(frozen=True)
class EngineRequest:
    """The request one decode engine pulls: where prefill holds it, where decode wants it, the plan."""

    prefill: Request
    decode: Request
    plan: TransferPlan


def prefill_ranks(layout: SideLayout) -> int:
    return layout.side.tensor_parallel * layout.side.pipeline_parallel


Pool = tuple[int, int]
"""(blocks, state slots) of one rank's cache pool."""


def pools(p: SideLayout, d: SideLayout, max_prompt: int, engines: int) -> tuple[Pool, Pool]:
    """(blocks, slots) of the prefill and decode pools holding `engines` requests of up to max_prompt."""
    return ((2 * blocks_needed(p, max_prompt) * engines, engines + 1),
            (2 * blocks_needed(d, max_prompt), DEFAULT_STATE_SLOT + 1))


def arena_bytes(p: SideLayout, d: SideLayout, max_prompt: int, engines: int) -> int:
    """The arena size a worker needs to play any rank of either side."""
    (pb, ps), (db, ds) = pools(p, d, max_prompt, engines)
    sizes = [arena.region_offsets(regions(p, r, pb, ps))[1] for r in range(prefill_ranks(p))]
    sizes += [arena.region_offsets(regions(d, r, db, ds))[1] for r in range(d.side.tensor_parallel)]
    return max(sizes)


def requests(p: SideLayout, d: SideLayout, prompt_tokens: int, engines: int) -> list[EngineRequest]:
    out = []
    for e in range(engines):
        n = blocks_needed(p, prompt_tokens)
        p_req = Request(synthetic_blocks(n) + 2 * n * e, e + 1, prompt_tokens, (e * TAG_STEP) & 0xFF)
        d_req = Request(synthetic_blocks(blocks_needed(d, prompt_tokens)), DEFAULT_STATE_SLOT, prompt_tokens,
                        p_req.tag)
        plan = plan_transfer(p, d, prompt_tokens, prefill_blocks=p_req.blocks, decode_blocks=d_req.blocks,
                             prefill_slot=p_req.slot, decode_slot=d_req.slot)
        out.append(EngineRequest(p_req, d_req, plan))
    return out


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


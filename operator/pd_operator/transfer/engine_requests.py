"""The requests a prefill engine and one or more decode engines exchange, and the cache pools that
hold them: each decode engine pulls its own request from the one prefill engine; the requests live
in different prefill blocks and state slots and carry different tags, so a pull of the wrong request
shows. The KV-link probe builds its geometry from these; the transfer tests' rank processes
(tests/support/ranks.py) place and pull them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.simulate import regions
from pd_operator.kv.transfer_plan import (
    DEFAULT_STATE_SLOT,
    TransferPlan,
    blocks_needed,
    plan_transfer,
    synthetic_blocks,
)
from pd_operator.transfer import arena
from pd_operator.transfer.kv_content import Request

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

"""Real bytes through the real Mooncake engine: prefill and decode ranks of different TP sizes and
engine block sizes, one process each, decode pulling by the plan; every decode byte is compared
with what a decode that computed the prompt itself would hold, and no other byte may change."""

from __future__ import annotations

import pytest

from pd_operator.kv.compat import check_pair
from pd_operator.transfer.engine_requests import requests
from pd_operator.transfer.executor import PullOptions
from support.ranks import Pairing
from support.transfer_pairings import PAIRINGS, PROMPTS, QWEN_KV_DIMS

pytestmark = pytest.mark.transfer

# A small queue budget and two streams per peer force many concurrent batches across layers.
SMALL_BATCHES = PullOptions(queue_limit=8, streams_per_peer=2)


def test_pairings_are_the_cross_tp_ones():
    """The tier covers unequal block sizes (GLM TP8 vs TP4) and a sharded cache split over more
    decode ranks than prefill ranks (dense attention TP2 -> TP4), all judged compatible."""
    p8, d4, _ = PAIRINGS["glm-p8-d4"]
    assert p8.engine_block_size != d4.engine_block_size
    for p, d, _ in PAIRINGS.values():
        assert check_pair(p.side, d.side).compatible


def test_a_state_with_unequal_key_and_value_dims_is_in_the_tier():
    """Gated DeltaNet read from a config.json with 128-wide key heads and 64-wide value heads, as vLLM's
    state shape describes it; TP2 -> TP4 re-shards every part of it."""
    shapes = [(t.head_groups, t.head_shape) for t in QWEN_KV_DIMS.group("deltanet").tensors]
    assert shapes == [([16, 16], [128]), ([32], [64]), ([32], [64, 128])]
    p, d, _ = PAIRINGS["qwen3-next-kv-dims-p2-d4"]
    assert p.group("deltanet").state_bytes == 2 * d.group("deltanet").state_bytes


CASES = [*((name, None) for name in PAIRINGS), ("glm-p8-d4", SMALL_BATCHES)]


@pytest.mark.parametrize("name, options", CASES,
                         ids=[name + ("-small-batches" if options else "") for name, options in CASES])
def test_decode_holds_exactly_the_prompt(rank_pool, name, options):
    p_layout, d_layout, engines = PAIRINGS[name]
    pairing = Pairing.place(rank_pool, p_layout, d_layout, max(PROMPTS), engines)
    for prompt in PROMPTS:
        reqs = requests(p_layout, d_layout, prompt, engines)
        pairing.load(reqs)
        reports = pairing.pull([r.plan for r in reqs], options)
        for req, engine_reports in zip(reqs, reports, strict=True):
            for rank, report in enumerate(engine_reports):
                mine = [rs for rs in req.plan.runsets if rs.decode_rank == rank]
                assert report["ok"], (prompt, report["failures"])
                assert report["entries"] == sum(rs.entries for rs in mine)
                assert report["bytes"] == sum(rs.bytes for rs in mine) > 0
                if options is SMALL_BATCHES:
                    assert report["batches"] >= report["entries"] / options.batch_size()
        assert pairing.verify(reqs) == [], f"{name}, {prompt}-token prompt"

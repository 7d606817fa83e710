"""Property tests of the transfer plan over TP/DP/PP pairs, block sizes, kernel blocks and prompt lengths.

Each example executes the plan on in-memory paged buffers (`simulate.run_reference`) and checks that
the decode ranks end up holding exactly the prompt, that every run is in bounds, and that the merged
plan has the fewest runs possible, counted here by merging the naive per-segment plan with a loop.
"""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.compat import check_pair
from pd_operator.kv.model import ModelKV
from pd_operator.kv.side import Side
from pd_operator.kv.simulate import pool_sizes, regions, run_reference
from pd_operator.kv.transfer_plan import TransferPlan, blocks_needed, plan_transfer

TPS = (1, 2, 4, 8, 16)
PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def few_layers(model: ModelKV, layers: int = 2) -> ModelKV:
    """Layer counts only scale the bytes; two layers per group keep buffers small and allow PP 2."""
    groups = [g.model_copy(update={"num_layers": layers}) for g in model.groups]
    return model.model_copy(update={"groups": groups})


PRESETS = {name: few_layers(presets.get(name)) for name in presets.names()}
SOURCES = [*PRESETS, "generated"]


@st.composite
def generated_models(draw) -> ModelKV:
    """Small random descriptions: dense or MLA attention, optional (compressed) indexer and state."""
    groups: list[dict] = []
    if draw(st.booleans()):
        groups.append({"kind": "attention", "name": "attn", "numLayers": 2,
                       "numKvHeads": draw(st.sampled_from([1, 2, 4, 8, 16])),
                       "headSize": draw(st.sampled_from([8, 16, 24]))})
    else:
        groups.append({"kind": "mla", "name": "mla", "numLayers": 2,
                       "kvLoraRank": draw(st.sampled_from([16, 48])),
                       "qkRopeHeadDim": draw(st.sampled_from([0, 8]))})
        if draw(st.booleans()):
            ratio = draw(st.sampled_from([1, 2, 4]))
            groups.append({"kind": "indexer", "name": "idx", "numLayers": 2, "headDim": 16,
                           "compressRatio": ratio, "quantBlockSize": 8,
                           "dtype": draw(st.sampled_from(["fp8", "bfloat16"]))})
            if ratio > 1 and draw(st.booleans()):  # a pooled indexer's per-request tail, one MTP layer
                groups.append({"kind": "indexerTail", "name": "tail", "numLayers": 2, "mtpLayers": 1,
                               "headDim": 16, "poolTokens": ratio})
    if draw(st.booleans()):
        heads = draw(st.sampled_from([16, 32]))
        groups.append({"kind": "state", "name": "ssm", "numLayers": 2, "tensors": [
            {"name": "rec", "dtype": "float32", "headGroups": [heads], "headShape": [4, 8]},
            {"name": "conv", "dtype": "bfloat16", "headGroups": [heads, heads // 2], "headShape": [8],
             "convKernel": 4}]})
    return ModelKV.model_validate({"name": "generated", "groups": groups})


def models(source: str | None = None) -> st.SearchStrategy[ModelKV]:
    """One preset, generated descriptions, or (None) any of them."""
    if source is None:
        return st.one_of(st.sampled_from(list(PRESETS.values())), generated_models())
    return generated_models() if source == "generated" else st.just(PRESETS[source])


@st.composite
def pairings(draw, source: str | None = None) -> tuple[Side, Side, int]:
    model = draw(models(source))
    kernel = draw(st.sampled_from([16, 64, 128]))
    spec = draw(st.sampled_from([0, 0, 1]))

    def side(role: str, pp: int) -> Side:
        requested = draw(st.sampled_from([None, None, kernel, 2 * kernel, 5 * kernel]))
        return Side(role, model, draw(st.sampled_from(TPS)), draw(st.sampled_from([1, 2])), pp,  # type: ignore[arg-type]
                    block_size=requested, kernel_block_size=kernel, num_speculative_tokens=spec)

    prefill, decode = side("prefill", draw(st.sampled_from([1, 2]))), side("decode", 1)
    report = check_pair(prefill, decode)
    assume(report.compatible)
    assert report.prefill_layout and report.decode_layout
    blocks = (report.prefill_layout.engine_block_size, report.decode_layout.engine_block_size)
    prompt = draw(st.one_of(
        st.just(1),
        st.sampled_from([b + delta for b in blocks for delta in (-1, 0, 1) if b + delta > 0]),
        st.integers(1, 3 * max(blocks))))
    return prefill, decode, prompt


BLOCK_TABLES = st.sampled_from(["gapped", "contiguous", "shuffled"])


def block_table(kind: str, count: int, seed: int) -> np.ndarray | None:
    if kind == "gapped":
        return None  # the plan's default: 1, 3, 5, ... (nothing merges across blocks)
    if kind == "contiguous":
        return np.arange(2, 2 + count)
    return np.random.default_rng(seed).permutation(count + 3)[:count]


def make_plan(prefill: Side, decode: Side, prompt: int, tables: str, merge: bool = True) -> TransferPlan:
    p, d = side_layout(prefill), side_layout(decode)
    return plan_transfer(p, d, prompt, merge=merge,
                         prefill_blocks=block_table(tables, blocks_needed(p, prompt), 1),
                         decode_blocks=block_table(tables, blocks_needed(d, prompt), 2))


def loop_merged_count(plan: TransferPlan) -> int:
    """Count maximal runs contiguous on both sides, by walking each run list in destination order."""
    total = 0
    for rs in plan.runsets:
        runs, src_end, dst_end = 0, None, None
        triples = zip(rs.dst.tolist(), rs.src.tolist(), rs.length.tolist(), strict=True)
        for dst, src, length in sorted(triples):
            if not (dst == dst_end and src == src_end):
                runs += 1
            src_end, dst_end = src + length, dst + length
        total += runs * len(rs.layers)
    return total


PER_SOURCE = settings(PROPERTY, max_examples=15)


@pytest.mark.parametrize("source", SOURCES)
def test_plan_copies_exactly_the_prompt(source):
    @PER_SOURCE
    @given(pairings(source), BLOCK_TABLES)
    def check(pairing, tables):
        prefill, decode, prompt = pairing
        exact, problem = run_reference(make_plan(prefill, decode, prompt, tables))
        assert exact, problem

    check()


@PROPERTY
@given(pairings(), BLOCK_TABLES)
def test_naive_plan_is_exact_too(pairing, tables):
    prefill, decode, prompt = pairing
    exact, problem = run_reference(make_plan(prefill, decode, prompt, tables, merge=False))
    assert exact, problem


@PROPERTY
@given(pairings(), BLOCK_TABLES)
def test_every_run_is_non_empty_and_within_bounds_on_both_sides(pairing, tables):
    prefill, decode, prompt = pairing
    plan = make_plan(prefill, decode, prompt, tables)
    (p_blocks, p_slots), (d_blocks, d_slots) = pool_sizes(plan)
    p_ranks = prefill.tensor_parallel * prefill.pipeline_parallel
    p_sizes = {(rank, r.key): r.nbytes for rank in range(p_ranks)
               for r in regions(plan.prefill, rank, p_blocks, p_slots)}
    d_sizes = {(rank, r.key): r.nbytes for rank in range(decode.tensor_parallel)
               for r in regions(plan.decode, rank, d_blocks, d_slots)}
    for rs in plan.runsets:
        assert (rs.length > 0).all()
        for layer in rs.layers:
            key = (rs.group, rs.component, layer)
            assert (rs.src >= 0).all() and (rs.dst >= 0).all()
            assert (rs.src + rs.length <= p_sizes[rs.prefill_rank, key]).all()
            assert (rs.dst + rs.length <= d_sizes[rs.decode_rank, key]).all()


@pytest.mark.parametrize("source", SOURCES)
def test_merged_plan_has_the_minimum_number_of_runs(source):
    @PER_SOURCE
    @given(pairings(source), BLOCK_TABLES)
    def check(pairing, tables):
        prefill, decode, prompt = pairing
        merged = make_plan(prefill, decode, prompt, tables)
        naive = make_plan(prefill, decode, prompt, tables, merge=False)
        assert merged.bytes == naive.bytes
        assert merged.entries == loop_merged_count(naive) <= naive.entries

    check()


@PROPERTY
@given(pairings())
def test_findings_are_deterministic(pairing):
    prefill, decode, prompt = pairing
    first = check_pair(prefill, decode, prompt_tokens=prompt).findings
    rebuilt = [Side(s.role, s.model.model_copy(deep=True), s.tensor_parallel, s.data_parallel,
                    s.pipeline_parallel, s.kv_cache_dtype, s.block_size, s.kernel_block_size,
                    s.num_speculative_tokens) for s in (prefill, decode)]
    assert check_pair(*rebuilt, prompt_tokens=prompt).findings == first


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(TPS), st.sampled_from(TPS), st.integers(1, 9000))
def test_findings_are_deterministic_for_any_tp_pair(p_tp, d_tp, prompt):
    """Incompatible pairs included: the list (and its order) depends on the input only."""
    glm = presets.get("glm-5.3-flash")
    sides = (Side("prefill", glm, p_tp), Side("decode", glm, d_tp, 2))
    first = check_pair(*sides, prompt_tokens=prompt).findings
    assert check_pair(*sides, prompt_tokens=prompt).findings == first


def test_replicated_runs_are_cut_at_both_sides_block_boundaries():
    """GLM P TP8 (640-token blocks) -> D TP4 (1152): one run per region between the union of cuts."""
    glm = presets.get("glm-5.3-flash")
    prompt = 8192
    plan = plan_transfer(side_layout(Side("prefill", glm, 8)), side_layout(Side("decode", glm, 4)), prompt)
    cuts = set(range(0, prompt, 640)) | set(range(0, prompt, 1152))
    mla_entries = sum(rs.entries for rs in plan.runsets if rs.group == "mla")
    assert mla_entries == len(cuts) * 11 * 4  # per layer, per decode rank
    idx_cuts = set(range(0, ceil(prompt / 4), 160)) | set(range(0, ceil(prompt / 4), 288))
    assert sum(rs.entries for rs in plan.runsets if rs.group == "indexer") == len(idx_cuts) * 11 * 4
    # State: each decode rank gets its heads of 4 parts (recurrent, conv q/k/v) from 2 prefill ranks.
    assert sum(rs.entries for rs in plan.runsets if rs.group == "kda") == 4 * 2 * 34 * 4


def test_replicated_groups_spread_over_prefill_ranks():
    glm = presets.get("glm-5.3-flash")
    plan = plan_transfer(side_layout(Side("prefill", glm, 8)), side_layout(Side("decode", glm, 4)), 1000)
    sources = {(rs.group, rs.decode_rank): rs.prefill_rank for rs in plan.runsets if rs.group != "kda"}
    assert len(set(sources.values())) == 8  # all eight prefill ranks serve some replicated pulls

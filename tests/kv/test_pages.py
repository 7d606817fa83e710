"""Page bytes per cache kind as a function of TP (the page_size_bytes formulas of vllm-project/vllm:
vllm/v1/kv_cache_interface.py @ v0.34.0, written out here)."""

import pytest

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.model import ModelKV
from pd_operator.kv.pages import LayoutError, token_group_layout
from pd_operator.kv.side import Side

BLOCK = 128


def model(*groups: dict, dtype: str = "bfloat16") -> ModelKV:
    return ModelKV.model_validate({"name": "m", "dtype": dtype, "groups": list(groups)})


def attention(heads: int, head_size: int = 128, **kw) -> dict:
    return {"kind": "attention", "name": "attn", "numLayers": 2, "numKvHeads": heads, "headSize": head_size,
            **kw}


def mla(rank: int = 512, rope: int = 64, **kw) -> dict:
    return {"kind": "mla", "name": "mla", "numLayers": 2, "kvLoraRank": rank, "qkRopeHeadDim": rope, **kw}


def indexer(ratio: int = 1, dtype: str = "bfloat16", head_dim: int = 128) -> dict:
    return {"kind": "indexer", "name": "idx", "numLayers": 2, "headDim": head_dim, "compressRatio": ratio,
            "dtype": dtype}


def page(m: ModelKV, name: str, tp: int, block: int = BLOCK, kv_cache_dtype: str = "auto"):
    side = Side("prefill", m, tp, kv_cache_dtype=kv_cache_dtype, path="spec.prefill")
    return token_group_layout(m.group(name), side, block)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_dense_attention_is_sharded_over_tp(tp):
    g = page(model(attention(8)), "attn", tp)
    per_rank = 8 // tp
    assert g.heads_local == per_rank and not g.replicated
    assert g.page_bytes == 2 * BLOCK * per_rank * 128 * 2  # K and V
    assert g.bytes_per_token == 2 * per_rank * 128 * 2
    assert [list(g.heads_of(r)) for r in range(tp)] == [list(range(r * per_rank, (r + 1) * per_rank))
                                                        for r in range(tp)]


@pytest.mark.parametrize("tp", [16, 32])
def test_dense_attention_replicates_when_kv_heads_are_fewer_than_tp(tp):
    g = page(model(attention(8)), "attn", tp)
    assert g.heads_local == 1 and g.replicated
    assert g.page_bytes == 2 * BLOCK * 1 * 128 * 2
    holders = [g.heads_of(r).start for r in range(tp)]
    assert sorted(set(holders)) == list(range(8))
    assert all(holders.count(h) == tp // 8 for h in range(8))


@pytest.mark.parametrize("tp", [1, 4, 16])
def test_mla_is_one_replicated_head_whatever_the_tp(tp):
    g = page(model(mla(512, 64)), "mla", tp)
    assert g.replicated and g.heads_local == 1
    assert g.page_bytes == BLOCK * (512 + 64) * 2  # no factor 2: the latent is K and V at once


def test_nope_mla_has_an_empty_rope_component():
    g = page(model(mla(512, 0)), "mla", 8)
    assert dict(g.components) == {"nope": 1024, "rope": 0}
    assert g.page_bytes == BLOCK * 512 * 2
    assert g.stride("rope") == 0


def test_kv_cache_dtype_changes_the_attention_page():
    m = model(mla(512, 64))
    assert page(m, "mla", 1, kv_cache_dtype="fp8").page_bytes * 2 == page(m, "mla", 1).page_bytes


def test_indexer_fp8_carries_a_4_byte_scale_per_quant_block():
    g = page(model(mla(), indexer(dtype="fp8")), "idx", 4)
    assert g.entry_bytes == 128 + 128 // 128 * 4 == 132
    assert g.page_bytes == BLOCK * 132 and g.replicated


def test_indexer_fp8_quant_block_64_has_two_scales():
    spec = {**indexer(dtype="fp8"), "quantBlockSize": 64}
    assert page(model(mla(), spec), "idx", 1).entry_bytes == 128 + 2 * 4


def test_indexer_bf16_stores_two_bytes_per_element():
    g = page(model(mla(), indexer(dtype="bfloat16")), "idx", 2)
    assert g.entry_bytes == 256 and g.page_bytes == BLOCK * 256


@pytest.mark.parametrize(("ratio", "block"), [(4, 640), (4, 1152), (2, 256), (1, 128)])
def test_compressed_indexer_stores_one_entry_per_ratio_tokens(ratio, block):
    g = page(model(mla(), indexer(ratio=ratio)), "idx", 1, block=block)
    assert g.entries_per_block == block // ratio
    assert g.page_bytes == block // ratio * 256
    assert g.bytes_per_token == 256 / ratio


def test_glm_indexer_blocks_hold_160_and_288_entries_at_tp8_and_tp4():
    """The two entry counts the seed reviewer called a poor fit for 32-entry kernel pages."""
    glm = presets.get("glm-5.3-flash")
    assert side_layout(Side("prefill", glm, 8)).group("indexer").entries_per_block == 160
    assert side_layout(Side("decode", glm, 4)).group("indexer").entries_per_block == 288


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32, 64])
def test_state_shrinks_as_tp_grows(tp):
    layout = side_layout(Side("prefill", presets.get("glm-5.3-flash"), tp))
    (kda,) = layout.state_groups
    assert kda.state_bytes == (64 * 128 * 128 * 4 + 3 * 64 * 128 * 3 * 2) // tp
    assert not kda.replicated
    # Parts are laid out back to back: recurrent, then conv q, k, v.
    offsets = [p.offset for _, parts in kda.tensors for p in parts]
    sizes = [p.chunk_bytes * p.heads_local for _, parts in kda.tensors for p in parts]
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]


@pytest.mark.parametrize(("heads", "tp"), [(8, 3), (6, 4), (2, 3), (12, 8)])
def test_kv_heads_not_divisible_by_tp(heads, tp):
    with pytest.raises(LayoutError) as err:
        page(model(attention(heads)), "attn", tp)
    assert err.value.code == "HeadsNotDivisibleByTP"
    assert err.value.field == "spec.prefill.tensorParallelSize"
    assert err.value.group == "attn"
    assert f"{heads} kv heads" in str(err.value)


def test_state_heads_not_divisible_by_tp():
    glm = presets.get("glm-5.3-flash")
    with pytest.raises(LayoutError) as err:
        side_layout(Side("decode", glm, 3, path="spec.decode"))
    assert (err.value.code, err.value.group, err.value.field) == (
        "HeadsNotDivisibleByTP", "kda", "spec.decode.tensorParallelSize")
    assert "64" in str(err.value) and "TP 3" in str(err.value)


def test_group_dtype_overrides_the_cache_dtype():
    m = model(attention(8, dtype="float32"))
    assert page(m, "attn", 1, kv_cache_dtype="fp8").page_bytes == 2 * BLOCK * 8 * 128 * 4


def test_unknown_dtype_is_rejected_by_the_description():
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        model(attention(8), dtype="int3")

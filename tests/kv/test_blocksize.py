"""Engine block sizes: vLLM's hybrid page-size unification and vllm-ascend's pooled-indexer rule.

The expected values come from short, separate transcriptions of the two rules over the raw GLM-5.3-Flash
shapes (not from `blocksize.py`): vLLM's `Platform.update_block_size_for_backend` /
`_align_hybrid_block_size` (vllm 0.34.0 `vllm/platforms/interface.py`) and vllm-ascend's patched
`verify_and_update_config` (vllm-ascend 0.30.0rc2 `vllm_ascend/patch/platform/patch_mamba_config.py`),
and from the values reported upstream. The `vllm` tier checks the first against vLLM's own code.
"""

from math import ceil, gcd

import pytest

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.model import ModelKV
from pd_operator.kv.side import Side

GLM = presets.get("glm-5.3-flash")
QWEN_NEXT = presets.get("qwen3-next-80b-a3b")
LLAMA = presets.get("llama-3.1-8b")
DEEPSEEK = presets.get("deepseek-v3.2")

BF16, FP32 = 2, 4


def glm_state_bytes(tp: int, spec_tokens: int = 0) -> int:
    """KDA state of one layer on one rank (vllm-project/vllm: vllm/model_executor/layers/mamba/
    mamba_utils.py kda_state_shape and kda_state_dtype @ v0.34.0: recurrent (64/TP, 128, 128) fp32,
    conv (3*64*128/TP, 3 + speculative tokens) bf16)."""
    recurrent = (64 // tp) * 128 * 128 * FP32
    conv = (3 * 64 * 128 // tp) * (4 - 1 + spec_tokens) * BF16
    return recurrent + conv


GLM_MLA_TOKEN = 512 * BF16  # NoPE latent, one replicated head, no rope


def unify(state_page: int, attn_token: int, kernel: int = 128, requested: int = 0, mla: bool = False) -> int:
    """vLLM: start from the requested block, else 64 when the kernel divides it, else the kernel block;
    align = max(kernel, start) (>= 128 for MLA); block = align * ceil(state / (align * attn_token)),
    rounded up to the kernel block, never below the start."""
    start = requested or (64 if 64 % kernel == 0 else kernel)
    align = max(kernel, start, 128 if mla else 0)
    block = align * ceil(state_page / (align * attn_token))
    return max(start, ceil(block / kernel) * kernel)


def ascend_pooled(state_page: int, attn_token: int, kpool: int = 4, requested: int = 0,
                  c8: bool = False) -> int:
    """vllm-ascend: align = lcm(128, kpool*16); block = align * ceil(max(requested or 128, min) / align),
    where min = ceil(state / attn_token); with C8 at most align * ceil(min / align)."""
    align = 128 * 16 * kpool // gcd(128, 16 * kpool)
    needed = ceil(state_page / attn_token)
    block = align * ceil(max(requested or 128, needed) / align)
    return min(block, align * ceil(needed / align)) if c8 else block


GLM_C8_TOKEN = 512 + 512 // 128 * 4  # int8 latent + one fp32 scale per 128 values


def engine_block(model: ModelKV, tp: int, **side_kw) -> int:
    return side_layout(Side("prefill", model, tp, **side_kw)).engine_block_size


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_glm_block_size_follows_the_formula(tp):
    expected = unify(glm_state_bytes(tp), GLM_MLA_TOKEN, mla=True)
    assert engine_block(GLM, tp) == expected


@pytest.mark.parametrize(("tp", "reported"), [(8, 640), (1, 4352)])
def test_glm_block_size_matches_upstream_reports(tp, reported):
    assert engine_block(GLM, tp) == reported


def test_glm_block_size_shrinks_with_tp():
    blocks = [engine_block(GLM, tp) for tp in (1, 2, 4, 8)]
    assert blocks == sorted(blocks, reverse=True)
    assert len(set(blocks)) == 4


@pytest.mark.parametrize("tp", [1, 8])
def test_mla_alignment_is_at_least_128_tokens(tp):
    """A 16-token kernel would allow finer blocks, but MLA keeps 128-token alignment."""
    block = engine_block(GLM, tp, kernel_block_size=16)
    assert block % 128 == 0
    assert block == unify(glm_state_bytes(tp), GLM_MLA_TOKEN, kernel=16, mla=True)
    assert block == engine_block(GLM, tp)


@pytest.mark.parametrize("kernel", [16, 64, 128])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_kernel_block_sets_the_alignment_of_attention_hybrids(kernel, tp):
    """Qwen3-Next (dense attention + DeltaNet state) aligns to the backend's kernel block."""
    kv_heads = max(1, 2 // tp)
    attn_token = 2 * kv_heads * 256 * BF16
    state = ((16 + 16 + 32) * 128 // tp) * 3 * BF16 + (32 // tp) * 128 * 128 * BF16
    block = engine_block(QWEN_NEXT, tp, kernel_block_size=kernel)
    assert block == unify(state, attn_token, kernel=kernel)
    assert block % kernel == 0


def test_kernel_16_gives_a_finer_block_than_128_for_attention_hybrids():
    assert engine_block(QWEN_NEXT, 1, kernel_block_size=16) < engine_block(QWEN_NEXT, 1)


@pytest.mark.parametrize("requested", [768, 1024, 4096])
def test_requested_block_larger_than_computed_is_kept(requested):
    assert engine_block(GLM, 8) == 640
    assert engine_block(GLM, 8, block_size=requested) == requested


def test_requested_block_smaller_than_computed_becomes_the_alignment_in_vllm():
    """vLLM aligns to max(kernel, requested): a 512 request at TP8 gives 2 x 512, not 640."""
    assert engine_block(GLM, 8, block_size=512, platform="vllm") == unify(
        glm_state_bytes(8), GLM_MLA_TOKEN, requested=512, mla=True) == 1024


def test_vllm_ascend_rounds_a_small_request_to_its_own_alignment():
    """vllm-ascend takes max(requested, needed) rounded to lcm(128, 4*16): 512 at TP8 gives 640."""
    assert engine_block(GLM, 8, block_size=512) == ascend_pooled(glm_state_bytes(8), GLM_MLA_TOKEN,
                                                                 requested=512) == 640


@pytest.mark.parametrize(("tp", "expected"), [(1, 8320), (2, 4224), (4, 2176), (8, 1152)])
def test_int8_kv_cache_packs_the_latent_at_528_bytes_on_vllm_ascend(tp, expected):
    assert engine_block(GLM, tp, kv_cache_dtype="int8") == ascend_pooled(
        glm_state_bytes(tp), GLM_C8_TOKEN, c8=True) == expected
    assert side_layout(Side("prefill", GLM, tp, kv_cache_dtype="int8")).attn_bytes_per_token == 528


@pytest.mark.parametrize(("tp", "ascend", "vllm"), [(1, 8320, 8576), (2, 4224, 4352)])
def test_int8_lands_on_another_block_in_plain_vllm(tp, ascend, vllm):
    """Plain vLLM has no int8 cache dtype; with fp8 (1 byte, no scales) its rule gives the larger block."""
    assert engine_block(GLM, tp, kv_cache_dtype="int8") == ascend
    assert engine_block(GLM, tp, kv_cache_dtype="fp8", platform="vllm") == vllm == unify(
        glm_state_bytes(tp), 512, mla=True)


@pytest.mark.parametrize(("tp", "expected"), [(1, 8576), (2, 4352)])
def test_int8_with_mtp3_on_vllm_ascend(tp, expected):
    assert engine_block(GLM, tp, kv_cache_dtype="int8", num_speculative_tokens=3) == ascend_pooled(
        glm_state_bytes(tp, 3), GLM_C8_TOKEN, c8=True) == expected


def test_c8_caps_a_larger_request_at_the_covering_block():
    assert engine_block(GLM, 8, kv_cache_dtype="int8", block_size=4096) == ascend_pooled(
        glm_state_bytes(8), GLM_C8_TOKEN, requested=4096, c8=True) == 1152


def test_a_pool_of_16_aligns_to_256_tokens_on_vllm_ascend():
    pool16 = GLM.model_copy(update={"groups": [g.model_copy(update={"compress_ratio": 16})
                                               if g.kind == "indexer" else g for g in GLM.groups]})
    for tp in (1, 2, 4, 8):
        block = engine_block(pool16, tp)
        assert block == ascend_pooled(glm_state_bytes(tp), GLM_MLA_TOKEN, kpool=16)
        assert block % 256 == 0


@pytest.mark.parametrize("spec", [1, 3, 7])
def test_speculative_tokens_lengthen_the_conv_state(spec):
    layout = side_layout(Side("prefill", GLM, 1, num_speculative_tokens=spec))
    assert layout.state_page_bytes == glm_state_bytes(1, spec) > glm_state_bytes(1)
    assert layout.engine_block_size == unify(glm_state_bytes(1, spec), GLM_MLA_TOKEN, mla=True)


def test_three_speculative_tokens_change_the_glm_tp1_block():
    assert engine_block(GLM, 1, num_speculative_tokens=3) == 4480 != engine_block(GLM, 1)


@pytest.mark.parametrize("model", [LLAMA, DEEPSEEK], ids=["dense", "mla-indexer"])
@pytest.mark.parametrize(("kernel", "requested", "expected"), [
    (128, None, 128), (16, None, 64), (32, None, 64), (48, None, 48), (128, 256, 256), (64, 1024, 1024)])
def test_models_without_state_use_the_kernel_or_requested_block(model, kernel, requested, expected):
    for tp in (1, 8):
        layout = side_layout(Side("prefill", model, tp, block_size=requested, kernel_block_size=kernel))
        assert layout.engine_block_size == expected
        assert layout.state_page_bytes == 0


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_state_page_is_padded_to_one_attention_page(tp):
    layout = side_layout(Side("prefill", GLM, tp))
    (kda,) = layout.state_groups
    assert kda.state_bytes == glm_state_bytes(tp)
    assert kda.slot_bytes == layout.engine_block_size * GLM_MLA_TOKEN == layout.main_page_bytes
    assert kda.slot_bytes >= kda.state_bytes
    assert layout.group("mla").page_bytes == kda.page_bytes


def test_reason_names_the_tp_and_the_state_page():
    layout = side_layout(Side("prefill", GLM, 8))
    assert "TP 8" in layout.reason and str(glm_state_bytes(8)) in layout.reason
    assert "starting block (128)" in side_layout(Side("prefill", LLAMA, 1)).reason
    assert "lcm(128, 4x16) = 128" in layout.reason

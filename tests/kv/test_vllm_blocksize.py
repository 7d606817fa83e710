"""Our engine block sizes against vLLM 0.34's own start-up code and vllm-ascend 0.30.0rc2's own block rule,
run in `.vllm-venv` on the same config.json files (tests/support/vllm_venv/block_alignment.py says exactly
which objects are real).

Hybrids vLLM can resolve here: Qwen3-Next (dense attention + Gated DeltaNet) and Kimi Linear (MLA + KDA),
the latter also with GLM-5.3-Flash's shapes (NoPE MLA 512, KDA 64 heads x 128, conv 4) and, for
vllm-ascend's rule, its pooled indexer keys (`index_topk`, `index_kpool` 4), which are what that rule
reads. vLLM's own Glm5Next classes cannot be resolved in the small recipe (their module imports the
multimodal GLM-4.1V code, which needs torchvision); their state shapes come from the same KDA calculator
the Kimi Linear class uses (vllm: MambaStateShapeCalculator.kda_state_shape).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.hf_config import model_from_hf_config
from pd_operator.kv.side import Side
from support.specs import example as load
from support.specs import resolve
from support.vllm_tier import hf_config, run_probe

pytestmark = pytest.mark.vllm

QWEN, KIMI, GLM_AS_KIMI = ("qwen3-next-80b-a3b-instruct", "kimi-linear-48b-a3b-instruct",
                           "glm-5.3-flash-as-kimi-linear")
GLM = presets.get("glm-5.3-flash")


def case(folder: str, tp: int, kernel: int = 128, block_size: int | None = None, spec: int = 0,
         kv_cache_dtype: str = "auto", platform: str = "vllm", prefix_caching: bool = False) -> dict:
    config = hf_config(folder)
    if platform == "ascend":  # what vllm-ascend's rule reads to recognise a pooled-indexer model
        config = {**config, "index_topk": 2048, "index_kpool": 4, "index_head_dim": 128, "index_n_heads": 32}
    named = (("b", block_size), ("s", spec), ("pc", prefix_caching))
    extras = "".join(f"-{name}{value}" for name, value in named if value)
    return {"id": f"{platform}-{folder}-tp{tp}-k{kernel}-{kv_cache_dtype}{extras}", "config": config,
            "dtype": config.get("dtype") or config.get("torch_dtype"), "tp": tp, "kernel": kernel,
            "blockSize": block_size, "specTokens": spec, "kvCacheDtype": kv_cache_dtype, "platform": platform,
            "prefixCaching": prefix_caching}


VLLM_CASES = [
    *(case(QWEN, tp) for tp in (1, 2, 4, 8, 16)),
    *(case(QWEN, tp, kernel) for tp in (1, 4) for kernel in (16, 64)),
    case(QWEN, 4, 16, block_size=1024),
    case(QWEN, 1, block_size=256),
    case(QWEN, 1, spec=2),
    *(case(KIMI, tp) for tp in (1, 2, 4, 8)),
    case(KIMI, 2, 64),
    case(KIMI, 1, spec=1),
    *(case(GLM_AS_KIMI, tp) for tp in (1, 2, 4, 8)),
    case(GLM_AS_KIMI, 1, spec=3),
    case(GLM_AS_KIMI, 8, block_size=512),
    case(GLM_AS_KIMI, 8, 16),
    case(GLM_AS_KIMI, 2, kv_cache_dtype="fp8"),
]
# vllm-ascend's rule: C8 (int8) and MTP 3 at TP1 and TP2, requested blocks, and bf16 at every TP.
ASCEND_CASES = [
    *(case(GLM_AS_KIMI, tp, kv_cache_dtype=dtype, spec=spec, platform="ascend")
      for tp in (1, 2) for dtype in ("auto", "int8") for spec in (0, 3)),
    *(case(GLM_AS_KIMI, tp, platform="ascend") for tp in (4, 8, 16)),
    *(case(GLM_AS_KIMI, 8, block_size=block, platform="ascend") for block in (256, 512, 1024)),
    case(GLM_AS_KIMI, 8, block_size=4096, kv_cache_dtype="int8", platform="ascend"),
    case(GLM_AS_KIMI, 1, block_size=384, platform="ascend"),
]

# Prefix caching on (vLLM's align mode): GLM on vllm-ascend's rule at every TP the examples use, with C8,
# MTP and a requested block, and each vLLM-rule model.
PREFIX_CACHING_CASES = [
    *(case(GLM_AS_KIMI, tp, platform="ascend", prefix_caching=True) for tp in (1, 2, 4, 8)),
    case(GLM_AS_KIMI, 2, kv_cache_dtype="int8", spec=3, platform="ascend", prefix_caching=True),
    case(GLM_AS_KIMI, 8, block_size=1024, platform="ascend", prefix_caching=True),
    *(case(folder, tp, prefix_caching=True) for folder in (QWEN, KIMI, GLM_AS_KIMI) for tp in (1, 4)),
    case(QWEN, 4, 16, block_size=1024, spec=2, prefix_caching=True),
]


@pytest.fixture(scope="module")
def probed() -> dict[str, dict]:
    return run_probe(VLLM_CASES + ASCEND_CASES + PREFIX_CACHING_CASES)


def our_side(c: dict, model=None) -> Side:
    model = model or model_from_hf_config(c["config"], "m")
    return Side("prefill", model, c["tp"], block_size=c["blockSize"], kernel_block_size=c["kernel"],
                num_speculative_tokens=c["specTokens"], kv_cache_dtype=c["kvCacheDtype"],
                platform=c["platform"], prefix_caching=c["prefixCaching"])


@pytest.mark.parametrize("c", VLLM_CASES, ids=[c["id"] for c in VLLM_CASES])
def test_block_size_matches_vllm(probed, c):
    row = probed[c["id"]]
    assert "refused" not in row, row["refused"]
    ours = side_layout(our_side(c))
    assert ours.engine_block_size == row["block"]
    # vLLM pads the state page to one attention page unless they are already equal.
    assert row["paddedStatePage"] in (None, ours.main_page_bytes)
    (state,) = ours.state_groups
    assert state.slot_bytes == ours.main_page_bytes


@pytest.mark.parametrize("c", ASCEND_CASES, ids=[c["id"] for c in ASCEND_CASES])
def test_glm_block_size_matches_vllm_ascends_own_rule(probed, c):
    """The GLM preset on vllm-ascend against vllm-ascend's patch_mamba_config.py run on the same shapes."""
    row = probed[c["id"]]
    assert "refused" not in row, row["refused"]
    ours = side_layout(our_side(c, GLM))
    assert ours.engine_block_size == row["block"]
    assert row["paddedStatePage"] == max(ours.main_page_bytes, ours.state_page_bytes)


@pytest.mark.parametrize(("tp", "dtype", "spec", "expected"), [
    (2, "int8", 0, 4224), (1, "int8", 0, 8320), (2, "int8", 3, 4352), (1, "int8", 3, 8576),
    (2, "auto", 3, 2304), (1, "auto", 3, 4480)])
def test_int8_and_mtp_blocks_are_vllm_ascends(probed, tp, dtype, spec, expected):
    c = case(GLM_AS_KIMI, tp, kv_cache_dtype=dtype, spec=spec, platform="ascend")
    assert probed[c["id"]]["block"] == expected == side_layout(our_side(c, GLM)).engine_block_size


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_vllm_agrees_with_the_glm_preset(probed, tp):
    row = probed[case(GLM_AS_KIMI, tp)["id"]]
    assert row["block"] == side_layout(Side("prefill", GLM, tp, platform="vllm")).engine_block_size
    assert row["block"] == {1: 4352, 2: 2176, 4: 1152, 8: 640}[tp]  # 640 and 1152 are reported upstream


@pytest.mark.parametrize("c", PREFIX_CACHING_CASES, ids=[c["id"] for c in PREFIX_CACHING_CASES])
def test_prefix_caching_blocks_and_costs_match_vllm(probed, c):
    """With prefix caching on, vLLM's align mode: the engine block (vllm-ascend's rule for GLM), the state
    block, the state slots a running request holds and where hits land, as vLLM's own classes give them."""
    row = probed[c["id"]]
    assert "refused" not in row, row["refused"]
    model = GLM if c["platform"] == "ascend" else None
    ours = side_layout(our_side(c, model))
    assert row["mambaCacheMode"] == ours.mamba_cache_mode == "align"
    assert row["block"] == ours.engine_block_size == row["mambaBlockSize"] == ours.state_block_size
    assert row["stateSlotsPerRequest"] == ours.state_slots_per_request == 2 + c["specTokens"]
    assert row["hitTokens"] == ours.prefix_hit_tokens == ours.engine_block_size
    # Align mode keeps the block of "none" mode on both rules (no layer exports prefill checkpoints).
    off = side_layout(replace(our_side(c, model), prefix_caching=False))
    assert ours.engine_block_size == off.engine_block_size


@pytest.mark.parametrize("example", ["glm-5.3-flash-tp8-dp2tp4.yaml", "glm-5.3-flash-1p1d-tp4.yaml"])
def test_glm_examples_prefix_caching_prefill_is_vllm_ascends(probed, example):
    """The GLM examples ask for prefix caching on prefill: their resolved prefill layout is the one
    vllm-ascend's rule and vLLM's align mode give for that shape, and decode stays in "none" mode."""
    resolved = resolve(load(example))
    prefill, decode = resolved.layouts["prefill"], resolved.layouts["decode"]
    asked = case(GLM_AS_KIMI, prefill.side.tensor_parallel, platform="ascend", prefix_caching=True)
    row = probed[asked["id"]]
    assert prefill.side.prefix_caching and not decode.side.prefix_caching
    assert (row["block"], row["mambaBlockSize"], row["stateSlotsPerRequest"], row["hitTokens"]) == (
        prefill.engine_block_size, prefill.state_block_size, prefill.state_slots_per_request,
        resolved.prefix_hit_tokens("prefill"))
    assert decode.mamba_cache_mode == "none" and resolved.prefix_hit_tokens("decode") is None

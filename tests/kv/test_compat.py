"""Every compatibility rule of `compat.check_pair` on a crafted pair: code, severity, path, group, and a
message that says what to change."""

from __future__ import annotations

import pytest

from pd_operator.findings import CATALOG, Finding
from pd_operator.kv import presets
from pd_operator.kv.compat import SMALL_RUN_BYTES, check_pair
from pd_operator.kv.model import ModelKV
from pd_operator.kv.side import Side

GLM = presets.get("glm-5.3-flash")
LLAMA = presets.get("llama-3.1-8b")
QWEN_NEXT = presets.get("qwen3-next-80b-a3b")


def prefill(model: ModelKV = GLM, tp: int = 8, **kw) -> Side:
    return Side("prefill", model, tp, path="spec.prefill", model_path="spec.model", **kw)


def decode(model: ModelKV = GLM, tp: int = 4, **kw) -> Side:
    return Side("decode", model, tp, 2, path="spec.decode", model_path="spec.model", **kw)


def only(findings: list[Finding], code: str, group: str | None = None) -> Finding:
    matching = [f for f in findings if f.code == code and group in (None, f.group)]
    assert len(matching) == 1, findings
    return matching[0]


C8_UNALIGNED = GLM.model_copy(update={"groups": [g.model_copy(update={"kv_lora_rank": 320}) if g.kind == "mla"
                                                  else g for g in GLM.groups]})


def dense(heads: int) -> ModelKV:
    return ModelKV.model_validate({"name": f"dense-{heads}", "groups": [
        {"kind": "attention", "name": "attention", "numLayers": 4, "numKvHeads": heads, "headSize": 64}]})


def test_the_seed_pairing_is_compatible_with_only_an_info_and_a_warning():
    report = check_pair(prefill(), decode())
    assert report.compatible
    assert {f.code for f in report.findings} == {"CrossTPSegments", "SmallTransferRuns"}
    assert report.plan is not None and report.segment_tokens == 128


def test_equal_sides_have_no_findings():
    report = check_pair(prefill(tp=4), decode(tp=4))
    assert report.findings == [] and report.compatible


CASES = [
    # (id, prefill side, decode side, connector, code, severity, path, group, advice in the message)
    ("segment-splits-compressed-entry",
     prefill(kernel_block_size=2, platform="vllm"),
     decode(tp=8, kernel_block_size=2, block_size=130, platform="vllm"), "MooncakeConnectorV2",
     "SegmentSplitsCompressedEntry", "error", "spec.decode.blockSize", "indexer",
     "so the gcd is a multiple of 4"),
    ("block-not-divisible-by-compress-ratio",
     prefill(tp=8, kernel_block_size=2, block_size=130, platform="vllm"),
     decode(tp=8, kernel_block_size=2, platform="vllm"),
     "MooncakeConnectorV2", "BlockNotDivisibleByCompressRatio", "error", "spec.prefill.blockSize", "indexer",
     "multiple of 4"),
    ("block-not-kernel-aligned",
     prefill(LLAMA, block_size=100), decode(LLAMA, block_size=128), "MooncakeConnectorV2",
     "BlockSizeNotKernelAligned", "error", "spec.prefill.blockSize", "",
     "Use a blockSize that is a multiple of 128"),
    ("sharded-tp-not-dividing",
     prefill(dense(12), tp=4), decode(dense(12), tp=6), "MooncakeConnectorV2",
     "ShardedTPIncompatible", "error", "spec.decode.tensorParallelSize", "attention",
     "choose a decode TP that divides or is a multiple of 4"),
    ("sharded-state-v1-larger-decode-tp",
     prefill(tp=4), decode(tp=8), "MooncakeConnectorV1",
     "ShardedTPIncompatible", "error", "spec.decode.tensorParallelSize", "kda",
     "use MooncakeConnectorV2 or a decode TP <= 4"),
    ("decode-pipeline-parallel",
     prefill(), decode(pipeline_parallel=2), "MooncakeConnectorV2",
     "DecodePipelineParallel", "error", "spec.decode.pipelineParallelSize", "", "set it to 1"),
    ("model-mismatch",
     prefill(), decode(LLAMA), "MooncakeConnectorV2",
     "ModelMismatch", "error", "spec.decode.model", "", "same model"),
    ("model-description-mismatch",
     prefill(), decode(GLM.model_copy(update={"groups": GLM.groups[:1] + GLM.groups[2:]})),
     "MooncakeConnectorV2",
     "ModelMismatch", "error", "spec.decode.model", "", "same model description"),
    ("dtype-mismatch",
     prefill(), decode(GLM.model_copy(update={"dtype": "float16"})), "MooncakeConnectorV2",
     "DTypeMismatch", "error", "spec.decode.dtype", "", "use the same dtype"),
    ("kv-cache-dtype-mismatch",
     prefill(), decode(kv_cache_dtype="fp8"), "MooncakeConnectorV2",
     "KVCacheDTypeMismatch", "error", "spec.decode.kvCacheDtype", "", "use the same kvCacheDtype"),
    ("v1-connector-kernel-blocks-differ",
     prefill(), decode(kernel_block_size=256), "MooncakeConnectorV1",
     "CrossTPBlockSizesUnsupported", "error", "spec.kvTransfer.connector", "",
     "'remote_block_size(640) not divisible by kernel_size(256)'"),
    ("state-shape-mismatch-from-speculative-tokens",
     prefill(QWEN_NEXT, tp=2), decode(QWEN_NEXT, tp=2, num_speculative_tokens=1), "MooncakeConnectorV2",
     "StateShapeMismatch", "error", "spec.decode.numSpeculativeTokens", "deltanet",
     "use the same numSpeculativeTokens"),
    ("kv-cache-dtype-incompatible-with-the-model",
     prefill(kv_cache_dtype="float16"), decode(kv_cache_dtype="float16"), "MooncakeConnectorV2",
     "KVCacheDTypeIncompatible", "error", "spec.model.kvCacheDtype", "",
     'kv_cache_dtype="float16" is incompatible with dtype="bfloat16"'),
    ("int8-kv-cache-on-plain-vllm",
     prefill(LLAMA, kv_cache_dtype="int8", platform="vllm"),
     decode(LLAMA, kv_cache_dtype="int8", platform="vllm"),
     "MooncakeConnectorV2", "KVCacheDTypeUnsupported", "error", "spec.model.kvCacheDtype", "",
     "only vllm-ascend adds int8"),
    ("ascend-block-rule-lowers-a-c8-request",
     prefill(kv_cache_dtype="int8"), decode(kv_cache_dtype="int8", block_size=4096),
     "MooncakeConnectorV2", "RequestedBlockLowered", "warning", "spec.decode.blockSize", "",
     "below the requested 4096"),
    ("heads-not-divisible",
     prefill(), decode(tp=3), "MooncakeConnectorV2",
     "HeadsNotDivisibleByTP", "error", "spec.decode.tensorParallelSize", "kda", "TP that divides 64"),
    ("ascend-block-rule-differs-from-vllms",
     prefill(), decode(tp=8, block_size=512), "MooncakeConnectorV2",
     "AscendBlockRuleDiffers", "info", "spec.decode.blockSize", "",
     "engine block is 640 tokens; plain vLLM's rule would give 1024"),
    ("c8-latent-not-tile-aligned",
     prefill(C8_UNALIGNED, kv_cache_dtype="int8"), decode(C8_UNALIGNED, kv_cache_dtype="int8"),
     "MooncakeConnectorV2", "C8LatentNotTileAligned", "error", "spec.model.kvCacheDtype", "mla",
     "use kvCacheDtype auto"),
    ("attention-heads-not-divisible",
     prefill(), decode(tp=3), "MooncakeConnectorV2",
     "HeadsNotDivisibleByTP", "error", "spec.decode.tensorParallelSize", "",
     "'Total number of attention heads (64) must be divisible by tensor parallel size (3).'"),
    ("cross-tp-segments-info",
     prefill(), decode(), "MooncakeConnectorV2",
     "CrossTPSegments", "info", "", "", "128-token segments"),
]


@pytest.mark.parametrize(("p", "d", "connector", "code", "severity", "path", "group", "advice"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_fires(p, d, connector, code, severity, path, group, advice):
    report = check_pair(p, d, connector=connector)
    finding = only(report.findings, code, group)
    assert (finding.severity, finding.path, finding.group) == (severity, path, group)
    assert advice in finding.message
    assert code in CATALOG
    assert report.compatible == (severity != "error")
    if severity == "error":
        assert report.plan is None


def test_segment_split_comes_with_the_side_rule_that_causes_it():
    """Both blocks divisible by the ratio imply a gcd divisible by it, so a split always has a side cause."""
    report = check_pair(prefill(kernel_block_size=2, platform="vllm"),
                        decode(tp=8, kernel_block_size=2, block_size=130, platform="vllm"))
    codes = [f.code for f in report.findings]
    assert "BlockNotDivisibleByCompressRatio" in codes and "SegmentSplitsCompressedEntry" in codes
    assert report.prefill_layout and report.decode_layout
    assert (report.prefill_layout.engine_block_size, report.decode_layout.engine_block_size) == (640, 650)


def test_speculative_tokens_change_the_glm_state_and_its_indexer_tail():
    report = check_pair(prefill(), decode(num_speculative_tokens=1))
    found = sorted(f.group for f in report.findings if f.code == "StateShapeMismatch")
    assert found == ["indexer-tail", "kda"]


def test_mtp_adds_the_draft_layer_to_the_mla_groups():
    report = check_pair(prefill(num_speculative_tokens=3), decode(num_speculative_tokens=3))
    assert report.compatible and report.prefill_layout is not None
    assert {g.name: g.num_layers for g in report.prefill_layout.groups} == {
        "mla": 12, "indexer": 12, "indexer-tail": 12, "kda": 34}
    assert report.prefill_layout.group("indexer-tail").page_bytes >= 2 * (4 + 3) * 128 * 4


def test_dtype_spellings_of_the_same_type_match():
    report = check_pair(prefill(GLM.model_copy(update={"dtype": "bf16"})), decode())
    assert not [f for f in report.findings if f.code == "DTypeMismatch"]
    assert report.compatible


@pytest.mark.parametrize(("platform", "refused"), [("vllm", False), ("ascend", True)])
def test_deepseek_v32_takes_a_bf16_kv_cache_as_auto_on_vllm(platform, refused):
    """vLLM 0.34's DeepseekV32ForCausalLM.verify_and_update_config (vllm/model_executor/models/config.py)
    turns --kv-cache-dtype bfloat16 into auto: a float16 DeepSeek-V3.2 keeps a float16 cache there."""
    model = presets.get("deepseek-v3.2").model_copy(update={"dtype": "float16"})
    sides = [Side(role, model, 8, kv_cache_dtype="bfloat16", platform=platform)
             for role in ("prefill", "decode")]
    report = check_pair(*sides)
    assert ("KVCacheDTypeIncompatible" in {f.code for f in report.findings}) is refused
    if not refused:
        assert sides[0].cache_dtype == "float16"


def test_small_runs_warning_gives_the_mean_run_size():
    report = check_pair(prefill(), decode(), prompt_tokens=8192)
    finding = only(report.findings, "SmallTransferRuns")
    assert (finding.severity, finding.path, finding.group) == ("warning", "spec.decode.blockSize", "indexer")
    # 2048 indexer entries of 256 bytes per layer, cut at multiples of 160 and of 288 entries.
    cuts = len(set(range(0, 2048, 160)) | set(range(0, 2048, 288)))
    assert f"{2048 * 256 / cuts / 1024:.1f} KiB" in finding.message
    assert "equal or multiples of each other" in finding.message


def test_no_small_runs_warning_when_runs_are_large():
    report = check_pair(prefill(tp=4), decode(tp=4), prompt_tokens=8192)
    assert report.plan is not None
    groups = report.plan.prefill.token_groups
    assert all(report.plan.mean_run_bytes(g.name) >= SMALL_RUN_BYTES for g in groups)
    assert not [f for f in report.findings if f.code == "SmallTransferRuns"]


def test_v1_connector_is_fine_with_equal_block_sizes():
    report = check_pair(prefill(tp=4), decode(tp=4), connector="MooncakeConnectorV1")
    assert report.compatible


def test_v1_connector_accepts_a_smaller_decode_tp_for_state_when_blocks_match():
    same = {"block_size": 4352}
    report = check_pair(prefill(tp=8, **same), decode(tp=4, **same), connector="MooncakeConnectorV1")
    assert report.compatible, report.findings


def test_sharded_state_with_non_dividing_tps():
    model = ModelKV.model_validate({"name": "s", "groups": [
        {"kind": "mla", "name": "mla", "numLayers": 1, "kvLoraRank": 64},
        {"kind": "state", "name": "ssm", "numLayers": 1, "tensors": [
            {"name": "rec", "dtype": "float32", "headGroups": [12], "headShape": [16]}]}]})
    finding = only(check_pair(prefill(model, tp=4), decode(model, tp=6)).findings, "ShardedTPIncompatible")
    assert finding.group == "ssm" and "prefill TP is 4 and decode TP is 6" in finding.message


def test_replicated_dense_heads_do_not_need_dividing_tps():
    """Two kv heads over TP 4 and 8: replicated on both sides, so any holder will do."""
    report = check_pair(prefill(QWEN_NEXT, tp=8), decode(QWEN_NEXT, tp=4))
    assert report.compatible, report.findings


def test_errors_on_both_sides_are_all_reported():
    report = check_pair(prefill(tp=3), decode(tp=3, pipeline_parallel=2))
    codes = sorted((f.code, f.path, f.group) for f in report.findings)
    assert codes == [("DecodePipelineParallel", "spec.decode.pipelineParallelSize", ""),
                     ("HeadsNotDivisibleByTP", "spec.decode.tensorParallelSize", ""),
                     ("HeadsNotDivisibleByTP", "spec.decode.tensorParallelSize", "kda"),
                     ("HeadsNotDivisibleByTP", "spec.prefill.tensorParallelSize", ""),
                     ("HeadsNotDivisibleByTP", "spec.prefill.tensorParallelSize", "kda")]

"""KV descriptions read from Hugging Face config.json files (public values of four models, under
hf_configs/), compared with the built-in presets; broken configs give a one-line error naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.hf_config import ConfigError, model_from_hf_config
from pd_operator.kv.model import ModelKV
from pd_operator.kv.side import Side

CONFIGS = Path(__file__).parent / "hf_configs"


def config(folder: str) -> dict:
    return json.loads((CONFIGS / folder / "config.json").read_text())


def layout_digest(model: ModelKV, tp: int) -> tuple:
    layout = side_layout(Side("prefill", model, tp))
    return layout.engine_block_size, [(g.name, g.kind, g.page_bytes, g.replicated) for g in layout.groups]


@pytest.mark.parametrize(("folder", "preset"), [
    ("deepseek-v3.2-exp", "deepseek-v3.2"),
    ("qwen3-next-80b-a3b-instruct", "qwen3-next-80b-a3b"),
    ("llama-3.1-8b", "llama-3.1-8b"),
])
def test_config_gives_the_preset_description(folder, preset):
    from_config = model_from_hf_config(config(folder), folder)
    expected = presets.get(preset)
    assert from_config.groups == expected.groups
    assert from_config.dtype == expected.dtype
    for tp in (1, 2, 4, 8):
        assert layout_digest(from_config, tp) == layout_digest(expected, tp)


def test_glm5_next_checkpoint_config_gives_the_glm_preset():
    """The released GLM-5.3-Flash config.json layout (Glm5NextForConditionalGeneration, the text model under
    `text_config`) reads as the preset: 11 MLA/indexer/tail layers + 1 MTP layer, 34 KDA layers."""
    cfg = config("glm-5.3-flash")
    assert cfg["architectures"] == ["Glm5NextForConditionalGeneration"] and "num_hidden_layers" not in cfg
    model = model_from_hf_config(cfg, "glm")
    assert model.groups == presets.get("glm-5.3-flash").groups
    assert [(g.name, g.num_layers, g.mtp_layers) for g in model.groups] == [
        ("mla", 11, 1), ("indexer", 11, 1), ("indexer-tail", 11, 1), ("kda", 34, 0)]


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_glm5_next_checkpoint_and_preset_give_the_same_block_sizes(tp, kv_cache_dtype):
    model = model_from_hf_config(config("glm-5.3-flash"), "glm")
    ours = side_layout(Side("prefill", model, tp, kv_cache_dtype=kv_cache_dtype)).engine_block_size
    preset = side_layout(Side("prefill", presets.get("glm-5.3-flash"), tp, kv_cache_dtype=kv_cache_dtype))
    assert ours == preset.engine_block_size
    if kv_cache_dtype == "auto":
        assert ours == {1: 4352, 2: 2176, 4: 1152, 8: 640}[tp]


def test_glm5_next_flat_text_config_reads_the_same():
    """A text-only checkpoint (Glm5NextForCausalLM, keys at the top level) gives the same description."""
    cfg = config("glm-5.3-flash")
    flat = {**cfg["text_config"], "architectures": ["Glm5NextForCausalLM"], "dtype": cfg["dtype"]}
    assert model_from_hf_config(flat, "glm").groups == presets.get("glm-5.3-flash").groups


def test_glm5_next_reads_flat_kda_keys_and_sparse_layer_types():
    cfg = config("glm-5.3-flash")
    text = cfg["text_config"]
    del text["linear_attn_config"]
    text.update(linear_num_heads=32, linear_head_dim=64, linear_conv_kernel_dim=4, num_hidden_layers=48,
                layer_types=["linear_attention", "deepseek_sparse_attention"] * 24)
    model = model_from_hf_config(cfg, "glm")
    assert (model.group("mla").num_layers, model.group("kda").num_layers) == (24, 24)
    assert model.group("kda").tensors[0].head_groups == [32]
    assert model.group("kda").tensors[0].head_shape == [64, 64]


def test_glm5_next_defaults_follow_vllm_ascend():
    """vllm-ascend 0.30.0rc2's Glm5NextTextConfig without the optional keys: no layer_types, so no KDA
    layer; no index_topk, so no sparse indexer; one MTP layer. With index_topk: index_kpool 4, and
    layer_types but no linear keys: 64 KDA heads of 128."""
    cfg = config("glm-5.3-flash")
    layer_types = cfg["text_config"]["layer_types"]
    cfg["text_config"] = {key: value for key, value in cfg["text_config"].items()
                          if not key.startswith(("linear_", "index_", "layer_types", "num_nextn"))}
    model = model_from_hf_config(cfg, "glm")
    assert [(g.name, g.num_layers, g.mtp_layers) for g in model.groups] == [("mla", 45, 1)]
    cfg["text_config"].update(index_topk=2048, index_head_dim=128, layer_types=layer_types)
    model = model_from_hf_config(cfg, "glm")
    assert model.group("indexer").compress_ratio == 4 == model.group("indexer-tail").pool_tokens
    assert (model.group("mla").num_layers, model.group("kda").num_layers) == (11, 34)
    assert model.group("kda").tensors[0].head_groups == [64]


def test_text_config_must_be_an_object():
    cfg = config("glm-5.3-flash")
    cfg["text_config"] = [1]
    with pytest.raises(ConfigError, match="'text_config' must be an object"):
        model_from_hf_config(cfg, "glm")


def test_kimi_linear_config_gives_mla_and_kda():
    model = model_from_hf_config(config("kimi-linear-48b-a3b-instruct"), "kimi")
    mla, kda = model.groups
    assert (mla.kind, mla.num_layers, mla.kv_lora_rank, mla.qk_rope_head_dim) == ("mla", 7, 512, 64)
    assert (kda.kind, kda.num_layers) == ("state", 20)
    recurrent, conv = kda.tensors
    assert (recurrent.dtype, recurrent.head_groups, recurrent.head_shape) == ("float32", [32], [128, 128])
    assert (conv.head_groups, conv.head_shape, conv.conv_kernel) == ([32, 32, 32], [128], 4)


def test_glm_shapes_in_kimi_linear_form_give_the_glm_block_sizes():
    model = model_from_hf_config(config("glm-5.3-flash-as-kimi-linear"), "glm-as-kimi")
    glm = presets.get("glm-5.3-flash")
    for tp in (1, 2, 4, 8):
        assert (side_layout(Side("prefill", model, tp)).engine_block_size
                == side_layout(Side("prefill", glm, tp)).engine_block_size)


def test_deepseek_v3_is_the_v32_preset_without_the_indexer():
    v3 = model_from_hf_config(config("deepseek-v3"), "deepseek-v3")
    assert v3.groups == [presets.get("deepseek-v3.2").group("mla")]
    assert side_layout(Side("prefill", v3, 8)).group("mla").page_bytes == 128 * (512 + 64) * 2


def test_qwen3_next_layer_types_override_the_interval():
    cfg = config("qwen3-next-80b-a3b-instruct")
    cfg["layer_types"] = ["linear_attention"] * 40 + ["full_attention"] * 8
    model = model_from_hf_config(cfg, "q")
    assert (model.group("attention").num_layers, model.group("deltanet").num_layers) == (8, 40)


def test_head_dim_defaults_to_hidden_size_over_heads():
    assert model_from_hf_config(config("llama-3.1-8b"), "l").group("attention").head_size == 4096 // 32


BROKEN = [
    ("llama-3.1-8b", "model_type", None, "config.json has no 'model_type'"),
    ("llama-3.1-8b", "model_type", "qwen2", "'model_type' is 'qwen2'; LlamaForCausalLM is read with"),
    ("llama-3.1-8b", "num_key_value_heads", "8", "'num_key_value_heads' must be an integer"),
    ("llama-3.1-8b", "num_attention_heads", 0, "'num_attention_heads' must be at least 1"),
    ("llama-3.1-8b", "head_dim", "128", "'head_dim' must be an integer"),
    ("llama-3.1-8b", "torch_dtype", "float4", "'torch_dtype' is 'float4'"),
    ("deepseek-v3", "qk_rope_head_dim", -1, "'qk_rope_head_dim' must be at least 0"),
    ("deepseek-v3.2-exp", "index_head_dim", True, "'index_head_dim' must be an integer"),
    ("deepseek-v3.2-exp", "index_head_dim", None, "no 'index_head_dim', which DeepseekV3Config"),
    ("qwen3-next-80b-a3b-instruct", "layer_types", ["full_attention"], "'layer_types' must list one type"),
    ("qwen3-next-80b-a3b-instruct", "layer_types", ["sliding"] * 48, "'layer_types' holds sliding"),
    ("qwen3-next-80b-a3b-instruct", "architectures", ["GPT2LMHeadModel"], "GPT2LMHeadModel has no KV"),
    ("qwen3-next-80b-a3b-instruct", "architectures", "Qwen3NextForCausalLM", "'architectures' list"),
    ("kimi-linear-48b-a3b-instruct", "kv_lora_rank", None, "no 'kv_lora_rank', which KimiLinearConfig"),
    ("kimi-linear-48b-a3b-instruct", "qk_rope_head_dim", None, "no 'qk_rope_head_dim'"),
    ("kimi-linear-48b-a3b-instruct", "linear_attn_config", None, "no 'linear_attn_config'"),
    ("kimi-linear-48b-a3b-instruct", "linear_attn_config", [], "'linear_attn_config' must be an object"),
    ("kimi-linear-48b-a3b-instruct", "linear_attn_config", {"kda_layers": [1], "full_attn_layers": [2]},
     "'linear_attn_config.num_heads', which vLLM reads without a default"),
    ("kimi-linear-48b-a3b-instruct", "linear_attn_config",
     {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 32, "head_dim": 128},
     "'linear_attn_config.short_conv_kernel_size'"),
    ("kimi-linear-48b-a3b-instruct", "linear_attn_config", {"num_heads": 32, "head_dim": 128},
     "'linear_attn_config.kda_layers' must list layer numbers"),
    ("kimi-linear-48b-a3b-instruct", "linear_attn_config", {"kda_layers": [1], "num_heads": 32},
     "'linear_attn_config.full_attn_layers' must list layer numbers"),
    ("glm-5.3-flash", "index_kpool", 0, "'index_kpool' must be at least 1"),
    ("glm-5.3-flash", "layer_types", ["linear_attention", "sliding_attention"] * 22 + ["linear_attention"],
     "'layer_types' holds sliding_attention"),
]


@pytest.mark.parametrize(("folder", "key", "value", "message"), BROKEN,
                         ids=[f"{b[0]}-{b[1]}-{b[2]!r}" for b in BROKEN])
def test_broken_config_names_the_key(folder, key, value, message):
    top = config(folder)
    cfg = top.get("text_config", top) if key not in ("architectures", "model_type") else top
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    with pytest.raises(ConfigError) as err:
        model_from_hf_config(top, folder)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("document", [[], "config", None, 3])
def test_config_must_be_an_object(document):
    with pytest.raises(ConfigError, match="must be a JSON object"):
        model_from_hf_config(document, "x")


def test_invalid_shape_after_reading_names_the_field():
    cfg = config("llama-3.1-8b")
    cfg["num_hidden_layers"] = 2_000_000
    with pytest.raises(ConfigError, match="numLayers") as err:
        model_from_hf_config(cfg, "x")
    assert "\n" not in str(err.value)

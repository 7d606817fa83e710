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
    ("llama-3.1-8b", "num_hidden_layers", None, "'num_hidden_layers'"),
    ("llama-3.1-8b", "num_key_value_heads", "8", "'num_key_value_heads' must be an integer"),
    ("llama-3.1-8b", "num_attention_heads", 0, "'num_attention_heads' must be at least 1"),
    ("llama-3.1-8b", "head_dim", "128", "'head_dim' must be an integer"),
    ("llama-3.1-8b", "hidden_size", 4095, "'hidden_size' 4095 is not a multiple"),
    ("llama-3.1-8b", "torch_dtype", "float4", "'torch_dtype' is 'float4'"),
    ("deepseek-v3", "kv_lora_rank", None, "'kv_lora_rank'"),
    ("deepseek-v3", "qk_rope_head_dim", -1, "'qk_rope_head_dim' must be at least 0"),
    ("deepseek-v3.2-exp", "index_head_dim", True, "'index_head_dim' must be an integer"),
    ("qwen3-next-80b-a3b-instruct", "linear_num_value_heads", None, "'linear_num_value_heads'"),
    ("qwen3-next-80b-a3b-instruct", "layer_types", ["full_attention"], "'layer_types' must list one type"),
    ("qwen3-next-80b-a3b-instruct", "layer_types", ["sliding"] * 48, "'layer_types' holds sliding"),
    ("qwen3-next-80b-a3b-instruct", "linear_value_head_dim", 64, "linear_value_head_dim differ"),
    ("qwen3-next-80b-a3b-instruct", "architectures", ["GPT2LMHeadModel"], "GPT2LMHeadModel has no KV"),
    ("qwen3-next-80b-a3b-instruct", "architectures", "Qwen3NextForCausalLM", "'architectures' list"),
]


@pytest.mark.parametrize(("folder", "key", "value", "message"), BROKEN,
                         ids=[f"{b[0]}-{b[1]}-{b[2]!r}" for b in BROKEN])
def test_broken_config_names_the_key(folder, key, value, message):
    cfg = config(folder)
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    with pytest.raises(ConfigError) as err:
        model_from_hf_config(cfg, folder)
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

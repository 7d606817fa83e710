"""KV descriptions from a Hugging Face `config.json`, for the architectures whose caches we know.

Field names and defaults follow the transformers configuration classes of each architecture
(DeepseekV3Config, the DeepSeek-V3.2 config's `index_*` keys, Qwen3NextConfig, LlamaConfig).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from pd_operator.kv.dtypes import DTYPE_BYTES, DTYPES
from pd_operator.kv.model import ModelKV

LLAMA_STYLE = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
})
DEEPSEEK_MLA = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
DEEPSEEK_SPARSE = frozenset({"DeepseekV32ForCausalLM"})
QWEN3_NEXT = frozenset({"Qwen3NextForCausalLM"})


class ConfigError(ValueError):
    """The config cannot be turned into a KV description; the message names the key."""


def _int(cfg: dict, key: str, default: int | None = None, minimum: int = 1) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"config.json has no {key!r}, which this architecture needs")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config.json {key!r} must be an integer, not {value!r}")
    if value < minimum:
        raise ConfigError(f"config.json {key!r} must be at least {minimum}, not {value}")
    return value


def _head_dim(cfg: dict) -> int:
    """`head_dim` when given, else hidden_size / num_attention_heads (the transformers default)."""
    if cfg.get("head_dim") is not None:
        return _int(cfg, "head_dim")
    heads, hidden = _int(cfg, "num_attention_heads"), _int(cfg, "hidden_size")
    if hidden % heads:
        raise ConfigError(f"config.json 'hidden_size' {hidden} is not a multiple of 'num_attention_heads' "
                          f"{heads}; give 'head_dim'")
    return hidden // heads


def _dtype(cfg: dict) -> str:
    key = "dtype" if cfg.get("dtype") else "torch_dtype"
    value = str(cfg.get(key) or "bfloat16").removeprefix("torch.")
    if value.lower() not in DTYPE_BYTES:
        raise ConfigError(f"config.json {key!r} is {value!r}; expected one of {', '.join(DTYPES)}")
    return value


def _llama(cfg: dict) -> list[dict]:
    heads = _int(cfg, "num_attention_heads")
    return [{"kind": "attention", "name": "attention", "numLayers": _int(cfg, "num_hidden_layers"),
             "numKvHeads": _int(cfg, "num_key_value_heads", heads), "headSize": _head_dim(cfg)}]


def _mla(cfg: dict) -> list[dict]:
    return [{"kind": "mla", "name": "mla", "numLayers": _int(cfg, "num_hidden_layers"),
             "kvLoraRank": _int(cfg, "kv_lora_rank"),
             "qkRopeHeadDim": _int(cfg, "qk_rope_head_dim", 0, minimum=0)}]


def _deepseek_sparse(cfg: dict) -> list[dict]:
    # The V3.2 indexer key cache is fp8 with one fp32 scale per 128 elements (vllm:
    # DeepseekV32IndexerCache), whatever the model dtype.
    return [*_mla(cfg), {"kind": "indexer", "name": "indexer", "numLayers": _int(cfg, "num_hidden_layers"),
                         "headDim": _int(cfg, "index_head_dim", 128), "dtype": "fp8",
                         "quantBlockSize": 128}]


def _qwen3_next(cfg: dict) -> list[dict]:
    layers = _int(cfg, "num_hidden_layers")
    types = cfg.get("layer_types")
    if types is None:
        interval = _int(cfg, "full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigError("config.json 'layer_types' must list one type per hidden layer")
    unknown = sorted({str(t) for t in types} - {"full_attention", "linear_attention"})
    if unknown:
        raise ConfigError(f"config.json 'layer_types' holds {', '.join(unknown)}; expected "
                          "full_attention or linear_attention")
    full = sum(1 for t in types if t == "full_attention")
    linear = layers - full
    key_heads, value_heads = _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_num_value_heads")
    key_dim, value_dim = _int(cfg, "linear_key_head_dim"), _int(cfg, "linear_value_head_dim")
    groups: list[dict] = []
    if full:
        groups.append({"kind": "attention", "name": "attention", "numLayers": full,
                       "numKvHeads": _int(cfg, "num_key_value_heads"),
                       "headSize": _head_dim(cfg)})
    if linear:
        if key_dim != value_dim:
            raise ConfigError("linear_key_head_dim and linear_value_head_dim differ; give an explicit kv "
                              "description for this model")
        state_dtype = _dtype(cfg)
        groups.append({"kind": "state", "name": "deltanet", "numLayers": linear, "tensors": [
            # Gated DeltaNet (vllm: gated_delta_net_state_shape): conv over q, k and v channels,
            # recurrent state of value heads x key dim x value dim.
            {"name": "conv", "dtype": state_dtype, "headGroups": [key_heads, key_heads, value_heads],
             "headShape": [key_dim], "convKernel": _int(cfg, "linear_conv_kernel_dim", 4)},
            {"name": "recurrent", "dtype": state_dtype, "headGroups": [value_heads],
             "headShape": [key_dim, value_dim]},
        ]})
    return groups


def _builder(architecture: str) -> Callable[[dict], list[dict]] | None:
    for names, build in ((LLAMA_STYLE, _llama), (DEEPSEEK_MLA, _mla), (DEEPSEEK_SPARSE, _deepseek_sparse),
                         (QWEN3_NEXT, _qwen3_next)):
        if architecture in names:
            return build
    return None


SUPPORTED_ARCHITECTURES = tuple(sorted(LLAMA_STYLE | DEEPSEEK_MLA | DEEPSEEK_SPARSE | QWEN3_NEXT))


def model_from_hf_config(config: Any, name: str) -> ModelKV:
    """Raises ConfigError (a ValueError) with a one-line reason for configs it cannot describe."""
    if not isinstance(config, dict):
        raise ConfigError("config.json must be a JSON object")
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not archs:
        raise ConfigError("config.json has no 'architectures' list")
    build = next((b for b in map(_builder, archs) if b), None)
    if build is None:
        raise ConfigError(f"architecture {archs[0]} has no KV description rule (supported: "
                          f"{', '.join(SUPPORTED_ARCHITECTURES)}); give an explicit kv description")
    try:
        return ModelKV.model_validate({"name": name, "dtype": _dtype(config), "groups": build(config)})
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError(f"config.json gives an invalid shape: {first['msg']} at "
                          f"{'.'.join(map(str, first['loc']))}") from None

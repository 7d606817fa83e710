"""KV descriptions from a Hugging Face `config.json`, for the architectures whose caches we know.

Field names and defaults follow the transformers configuration classes of each architecture
(DeepseekV3Config, the DeepSeek-V3.2 config's `index_*` keys, Qwen3NextConfig, LlamaConfig,
Glm5NextTextConfig, KimiLinearConfig).
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
GLM5_NEXT = frozenset({"Glm5NextForCausalLM", "Glm5NextForConditionalGeneration"})
KIMI_LINEAR = frozenset({"KimiLinearForCausalLM"})


class ConfigError(ValueError):
    """The config cannot be turned into a KV description; the message names the key."""


def _int(cfg: dict, key: str, default: int | None = None, minimum: int = 1, where: str = "") -> int:
    """`cfg[key]` as an integer >= minimum; `where` prefixes the key in messages (a nested object)."""
    value = cfg.get(key, default)
    name = repr(where + key)
    if value is None:
        raise ConfigError(f"config.json has no {name}, which this architecture needs")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config.json {name} must be an integer, not {value!r}")
    if value < minimum:
        raise ConfigError(f"config.json {name} must be at least {minimum}, not {value}")
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


def _mla(cfg: dict, layers: int | None = None) -> list[dict]:
    return [{"kind": "mla", "name": "mla", "numLayers": layers or _int(cfg, "num_hidden_layers"),
             "kvLoraRank": _int(cfg, "kv_lora_rank"),
             "qkRopeHeadDim": _int(cfg, "qk_rope_head_dim", 0, minimum=0)}]


def _deepseek_sparse(cfg: dict) -> list[dict]:
    # The V3.2 indexer key cache is fp8 with one fp32 scale per 128 elements (vllm:
    # DeepseekV32IndexerCache), whatever the model dtype.
    return [*_mla(cfg), {"kind": "indexer", "name": "indexer", "numLayers": _int(cfg, "num_hidden_layers"),
                         "headDim": _int(cfg, "index_head_dim", 128), "dtype": "fp8",
                         "quantBlockSize": 128}]


def _split_layers(cfg: dict, attention_types: frozenset[str]) -> tuple[int, int]:
    """(attention layers, linear-attention layers): from `layer_types`, else the last layer of every
    `full_attention_interval` (default 4) is full attention, as the transformers configs default."""
    layers = _int(cfg, "num_hidden_layers")
    types = cfg.get("layer_types")
    if types is None:
        full = layers // _int(cfg, "full_attention_interval", 4)
        return full, layers - full
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigError("config.json 'layer_types' must list one type per hidden layer")
    known = attention_types | {"linear_attention"}
    unknown = sorted({str(t) for t in types} - known)
    if unknown:
        raise ConfigError(f"config.json 'layer_types' holds {', '.join(unknown)}; expected "
                          f"{' or '.join(sorted(known))}")
    full = sum(1 for t in types if t in attention_types)
    return full, layers - full


def _qwen3_next(cfg: dict) -> list[dict]:
    full, linear = _split_layers(cfg, frozenset({"full_attention"}))
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


def _kda_state(cfg: dict, layers: int, heads: int, head_dim: int, conv_kernel: int) -> dict:
    # Kimi Delta Attention (vllm: MambaStateShapeCalculator.kda_state_shape and kda_state_dtype):
    # recurrent state heads x head_dim x head_dim in fp32, conv over q, k and v channels in the model
    # dtype. The recurrent state comes first, as in the glm-5.3-flash preset.
    return {"kind": "state", "name": "kda", "numLayers": layers, "tensors": [
        {"name": "recurrent", "dtype": "float32", "headGroups": [heads], "headShape": [head_dim, head_dim]},
        {"name": "conv", "dtype": _dtype(cfg), "headGroups": [heads] * 3, "headShape": [head_dim],
         "convKernel": conv_kernel},
    ]}


def _linear_attn_config(cfg: dict) -> dict:
    sub = cfg.get("linear_attn_config")
    if not isinstance(sub, dict):
        raise ConfigError("config.json 'linear_attn_config' must be an object with num_heads, head_dim "
                          "and short_conv_kernel_size")
    return sub


def _kda_dims(sub: dict) -> tuple[int, int, int]:
    where = "linear_attn_config."
    return (_int(sub, "num_heads", where=where), _int(sub, "head_dim", where=where),
            _int(sub, "short_conv_kernel_size", 4, where=where))


def _glm5_next(cfg: dict) -> list[dict]:
    """GLM-5-Next (GLM-5.3-Flash): NoPE MLA with a pooled indexer and its fp32 tail on the attention
    layers, KDA on the rest, and `num_nextn_predict_layers` MTP layers of the attention kind. Key names
    of transformers' Glm5NextTextConfig and vllm-ascend's (`vllm_ascend/models/glm5next/config.py` @
    0.30.0rc2, which also folds the checkpoint's `linear_attn_config` dict over the flat keys)."""
    mla_layers, kda_layers = _split_layers(
        cfg, frozenset({"indexed_attention", "full_attention", "deepseek_sparse_attention"}))
    if "linear_attn_config" in cfg:
        heads, head_dim, kernel = _kda_dims(_linear_attn_config(cfg))
    else:
        heads, head_dim = _int(cfg, "linear_num_heads", 64), _int(cfg, "linear_head_dim", 128)
        kernel = _int(cfg, "linear_conv_kernel_dim", 4)
    groups: list[dict] = []
    if mla_layers:
        mtp = _int(cfg, "num_nextn_predict_layers", 0, minimum=0)
        kpool = _int(cfg, "index_kpool", 16)
        index_dim = _int(cfg, "index_head_dim", 128)
        mla = _mla(cfg, mla_layers)[0]
        # vllm-ascend keeps the pooled indexer in bf16 whatever the KV cache dtype, and a pool of one
        # token has no tail (`Glm5NextIndexerCache`, `Glm5NextTailCache` in glm5next/kv_cache.py).
        groups += [{**mla, "mtpLayers": mtp},
                   {"kind": "indexer", "name": "indexer", "numLayers": mla_layers, "mtpLayers": mtp,
                    "headDim": index_dim, "compressRatio": kpool, "dtype": "bfloat16"}]
        if kpool > 1:
            groups.append({"kind": "indexerTail", "name": "indexer-tail", "numLayers": mla_layers,
                           "mtpLayers": mtp, "headDim": index_dim, "poolTokens": kpool})
    if kda_layers:
        groups.append(_kda_state(cfg, kda_layers, heads, head_dim, kernel))
    return groups


def _kimi_linear(cfg: dict) -> list[dict]:
    """Kimi Linear: MLA layers and KDA layers, listed 1-based in linear_attn_config.kda_layers."""
    layers = _int(cfg, "num_hidden_layers")
    sub = _linear_attn_config(cfg)
    listed = sub.get("kda_layers")
    if not isinstance(listed, list) or not all(type(i) is int for i in listed):
        raise ConfigError("config.json 'linear_attn_config.kda_layers' must list layer numbers (1-based)")
    kda_layers = sum(1 for i in range(layers) if i + 1 in set(listed))
    groups = _mla(cfg, layers - kda_layers) if kda_layers < layers else []
    if kda_layers:
        groups.append(_kda_state(cfg, kda_layers, *_kda_dims(sub)))
    return groups


def _builder(architecture: str) -> Callable[[dict], list[dict]] | None:
    for names, build in ((LLAMA_STYLE, _llama), (DEEPSEEK_MLA, _mla), (DEEPSEEK_SPARSE, _deepseek_sparse),
                         (QWEN3_NEXT, _qwen3_next), (GLM5_NEXT, _glm5_next), (KIMI_LINEAR, _kimi_linear)):
        if architecture in names:
            return build
    return None


SUPPORTED_ARCHITECTURES = tuple(sorted(LLAMA_STYLE | DEEPSEEK_MLA | DEEPSEEK_SPARSE | QWEN3_NEXT | GLM5_NEXT
                                       | KIMI_LINEAR))


def text_config(config: dict) -> dict:
    """The text model's keys: multimodal wrappers (GLM-5.3-Flash's Glm5NextForConditionalGeneration, the
    Qwen-VL and Llama-4 families) nest them under `text_config`, as transformers' `get_text_config` reads
    them. Top-level keys the nested object lacks (the checkpoint's dtype, for one) still apply."""
    nested = config.get("text_config")
    if nested is None:
        return config
    if not isinstance(nested, dict):
        raise ConfigError("config.json 'text_config' must be an object")
    return {**config, **nested}


def model_from_hf_config(config: Any, name: str) -> ModelKV:
    """Raises ConfigError (a ValueError) with a one-line reason for configs it cannot describe."""
    if not isinstance(config, dict):
        raise ConfigError("config.json must be a JSON object")
    archs = config.get("architectures")
    config = text_config(config)
    if archs:
        config["architectures"] = archs
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not archs:
        raise ConfigError("config.json has no 'architectures' list")
    build = next((b for b in map(_builder, archs) if b), None)
    if build is None:
        raise ConfigError(f"architecture {archs[0]} has no KV description rule (supported: "
                          f"{', '.join(SUPPORTED_ARCHITECTURES)}); give an explicit kv description")
    heads = _int(config, "num_attention_heads") if "num_attention_heads" in config else None
    try:
        return ModelKV.model_validate({"name": name, "dtype": _dtype(config), "attentionHeads": heads,
                                       "groups": build(config)})
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError(f"config.json gives an invalid shape: {first['msg']} at "
                          f"{'.'.join(map(str, first['loc']))}") from None

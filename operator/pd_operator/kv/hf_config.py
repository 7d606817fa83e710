"""KV descriptions from a Hugging Face `config.json`, for the architectures whose caches we know.

Every key is resolved as vLLM 0.34 resolves it: through the config class it builds for the config's
`model_type` (its own class where `vllm/transformers_utils/config.py` registers one, else transformers'
at the version its tier installs), so a key left out takes that class's default, and a key with no
default anywhere is refused by name rather than guessed. `CONFIG_CLASSES` holds each class's defaults
for the keys read here; the `vllm` tier checks them against the classes themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pd_operator.kv.dtypes import DTYPE_BYTES, DTYPES
from pd_operator.kv.model import ModelKV

TRANSFORMERS = "transformers 5.22.2"
VLLM = "vllm 0.34.0"


class Derived:
    """A default that is not a constant: the class computes it from other keys (see `_Keys.integer`)."""

    def __repr__(self) -> str:
        return "DERIVED"


DERIVED = Derived()
REQUIRED = None
"""No default: vLLM's model code reads the key bare, so a config without it fails there."""


@dataclass(frozen=True)
class ConfigClass:
    """The config class vLLM 0.34 builds for a `model_type`, as far as this reader reads it."""

    name: str
    source: str
    """Where the defaults are defined: `<package version>: <path>`."""
    defaults: Mapping[str, int | Derived | None]
    """Each key read -> its value when config.json leaves it out (DERIVED, REQUIRED: see above)."""
    model_code_keys: Mapping[str, str] = field(default_factory=dict)
    """Keys that are not fields of the class but that vLLM's model code reads off it -> where."""


def _tf(path: str) -> str:
    return f"{TRANSFORMERS}: src/transformers/models/{path}"


_LLAMA_LIKE = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}
_DEEPSEEK_V3 = {"num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512,
                "qk_rope_head_dim": 64}
CONFIG_CLASSES: dict[str, ConfigClass] = {
    "llama": ConfigClass("LlamaConfig", _tf("llama/configuration_llama.py"),
                         {**_LLAMA_LIKE, "num_key_value_heads": DERIVED, "head_dim": DERIVED}),
    "mistral": ConfigClass("MistralConfig", _tf("mistral/configuration_mistral.py"),
                           {**_LLAMA_LIKE, "num_key_value_heads": 8, "head_dim": DERIVED}),
    "mixtral": ConfigClass("MixtralConfig", _tf("mixtral/configuration_mixtral.py"),
                           {**_LLAMA_LIKE, "num_key_value_heads": 8, "head_dim": DERIVED}),
    # Qwen2 has no head_dim: vLLM's Qwen2Attention uses hidden_size // num_attention_heads whatever it says.
    "qwen2": ConfigClass("Qwen2Config", _tf("qwen2/configuration_qwen2.py"),
                         {**_LLAMA_LIKE, "num_key_value_heads": 32}),
    "qwen2_moe": ConfigClass("Qwen2MoeConfig", _tf("qwen2_moe/configuration_qwen2_moe.py"),
                             {"num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
                              "num_key_value_heads": 16}),
    "qwen3": ConfigClass("Qwen3Config", _tf("qwen3/configuration_qwen3.py"),
                         {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                          "head_dim": 128}),
    "qwen3_moe": ConfigClass(
        "Qwen3MoeConfig", _tf("qwen3_moe/configuration_qwen3_moe.py"),
        {"num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
         "head_dim": DERIVED},
        {"head_dim": f"{VLLM}: vllm/model_executor/models/qwen3_moe.py, getattr(config, 'head_dim', None)"}),
    "deepseek_v2": ConfigClass("DeepseekV2Config", _tf("deepseek_v2/configuration_deepseek_v2.py"),
                               {"num_hidden_layers": 32, "num_attention_heads": 32, "kv_lora_rank": 512,
                                "qk_rope_head_dim": 64}),
    "deepseek_v3": ConfigClass("DeepseekV3Config", _tf("deepseek_v3/configuration_deepseek_v3.py"),
                               _DEEPSEEK_V3),
    # vllm/transformers_utils/config.py registers transformers' DeepseekV3Config for deepseek_v32; the
    # indexer's keys are not its fields.
    "deepseek_v32": ConfigClass(
        "DeepseekV3Config", _tf("deepseek_v3/configuration_deepseek_v3.py"),
        {**_DEEPSEEK_V3, "index_head_dim": REQUIRED},
        {"index_head_dim": f"{VLLM}: vllm/models/deepseek_v32/attention.py, config.index_head_dim"}),
    "qwen3_next": ConfigClass(
        "Qwen3NextConfig", _tf("qwen3_next/configuration_qwen3_next.py"),
        {"num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
         "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
         "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
         "full_attention_interval": 4, "layer_types": DERIVED}),
    # vLLM's own class (vllm/transformers_utils/configs/kimi_linear.py): no MLA or KDA defaults, and vLLM's
    # KimiLinearForCausalLM reads linear_attn_config's keys bare.
    "kimi_linear": ConfigClass(
        "KimiLinearConfig", f"{VLLM}: vllm/transformers_utils/configs/kimi_linear.py",
        {"num_hidden_layers": 32, "num_attention_heads": 32, "kv_lora_rank": REQUIRED,
         "qk_rope_head_dim": REQUIRED, "linear_attn_config": REQUIRED}),
}
# GLM-5.3-Flash is served by vllm-ascend, whose patch_glm5next_config.py registers its own Glm5NextConfig and
# Glm5NextTextConfig for both model_types (nested as text_config, or flat): linear_attn_config's num_heads/
# head_dim/short_conv_kernel_size win over linear_num_heads/linear_head_dim/linear_conv_kernel_dim; without
# layer_types no layer is KDA, without index_topk there is no sparse indexer, and index_head_dim has no
# default (its indexer asserts it).
CONFIG_CLASSES["glm5_next"] = CONFIG_CLASSES["glm5_next_text"] = ConfigClass(
    "Glm5NextTextConfig", "vllm-ascend 0.30.0rc2: vllm_ascend/models/glm5next/config.py",
    {"num_hidden_layers": 45, "num_attention_heads": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 0,
     "index_topk": REQUIRED, "index_head_dim": REQUIRED, "index_kpool": 4, "linear_num_heads": 64,
     "linear_head_dim": 128, "linear_conv_kernel_dim": 4, "layer_types": DERIVED,
     "linear_attn_config": DERIVED, "num_nextn_predict_layers": 1})


class ConfigError(ValueError):
    """The config cannot be turned into a KV description; the message names the key."""

    def __init__(self, message: str, missing: str | None = None):
        super().__init__(message)
        self.missing = missing
        """The key (dotted when nested) whose absence is the reason, if that is the reason."""


class _Keys:
    """The text model's keys, each resolved as `cls` resolves it; `resolved` holds every key read, with
    the value used."""

    def __init__(self, cfg: dict, cls: ConfigClass, model_type: str):
        self.cfg, self.cls, self.model_type = cfg, cls, model_type
        self.resolved: dict[str, Any] = {}

    def raw(self, key: str) -> Any:
        """The value config.json gives, else the class default; REQUIRED and DERIVED come back as None."""
        if key not in self.cls.defaults:
            raise KeyError(f"{key} is not in the {self.cls.name} defaults table")  # a reader bug, not input
        default = self.cls.defaults[key]
        value = self.resolved[key] = self.cfg.get(key, None if isinstance(default, Derived) else default)
        return value

    def integer(self, key: str, minimum: int = 1) -> int:
        value = self.raw(key)
        if value is None and self.cls.defaults[key] is DERIVED:
            value = self._derived(key)
        value = self.resolved[key] = _checked_int(value, key, minimum, self._no_default(key))
        return value

    def _no_default(self, key: str) -> str:
        return (f"config.json has no {key!r}, which {self.cls.name} (model_type {self.model_type!r}) does "
                f"not default and this architecture needs")

    def _derived(self, key: str) -> int:
        heads = self.integer("num_attention_heads")
        if key == "num_key_value_heads":  # every class's __post_init__: None means one kv head per head
            return heads
        if key == "head_dim":
            # vLLM's ModelArchConfigConvertorBase.get_head_size and the attention layers: hidden_size //
            # num_attention_heads (floor division, as they compute it).
            return self.integer("hidden_size") // heads
        raise KeyError(key)

    def nested(self, key: str) -> dict | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ConfigError(f"config.json {key!r} must be an object")
        return value


def _checked_int(value: Any, key: str, minimum: int, missing: str) -> int:
    name = repr(key)
    if value is None:
        raise ConfigError(missing, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config.json {name} must be an integer, not {value!r}")
    if value < minimum:
        raise ConfigError(f"config.json {name} must be at least {minimum}, not {value}")
    return value


def _nested_int(sub: dict, parent: str, key: str, minimum: int = 1) -> int:
    """A key of a nested object that vLLM reads bare (`config.<parent>["<key>"]`): no default."""
    name = f"{parent}.{key}"
    return _checked_int(sub.get(key), name, minimum,
                        f"config.json has no {name!r}, which vLLM reads without a default")


def _dtype(cfg: dict) -> str:
    key = "dtype" if cfg.get("dtype") else "torch_dtype"
    value = str(cfg.get(key) or "bfloat16").removeprefix("torch.")
    if value.lower() not in DTYPE_BYTES:
        raise ConfigError(f"config.json {key!r} is {value!r}; expected one of {', '.join(DTYPES)}")
    return value


def _attention(k: _Keys, layers: int) -> dict:
    heads = k.integer("num_key_value_heads")
    # Without a head_dim field (Qwen2, Qwen2-MoE) vLLM's attention layers use hidden_size // heads.
    head_size = k.integer("head_dim") if "head_dim" in k.cls.defaults else k._derived("head_dim")
    return {"kind": "attention", "name": "attention", "numLayers": layers, "numKvHeads": heads,
            "headSize": head_size}


def _llama(k: _Keys) -> list[dict]:
    return [_attention(k, k.integer("num_hidden_layers"))]


def _mla(k: _Keys, layers: int | None = None) -> list[dict]:
    return [{"kind": "mla", "name": "mla", "numLayers": layers or k.integer("num_hidden_layers"),
             "kvLoraRank": k.integer("kv_lora_rank"),
             "qkRopeHeadDim": k.integer("qk_rope_head_dim", minimum=0)}]


def _deepseek_sparse(k: _Keys) -> list[dict]:
    # The V3.2 indexer key cache is fp8 with one fp32 scale per 128 elements (vllm:
    # DeepseekV32IndexerCache), whatever the model dtype.
    return [*_mla(k), {"kind": "indexer", "name": "indexer", "numLayers": k.integer("num_hidden_layers"),
                       "headDim": k.integer("index_head_dim"), "dtype": "fp8", "quantBlockSize": 128}]


def _split_layers(k: _Keys, attention_types: frozenset[str], derive: Callable[[int], int]) -> tuple[int, int]:
    """(attention layers, linear-attention layers) from `layer_types`, else `derive(layers)` attention
    layers, as the class's __post_init__ derives layer_types."""
    layers = k.integer("num_hidden_layers")
    types = k.raw("layer_types")
    if types is None:
        full = derive(layers)
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


def _qwen3_next(k: _Keys) -> list[dict]:
    # Qwen3NextConfig.__post_init__: the last layer of every `full_attention_interval` is full attention.
    full, linear = _split_layers(k, frozenset({"full_attention"}),
                                 lambda layers: layers // k.integer("full_attention_interval"))
    groups: list[dict] = [_attention(k, full)] if full else []
    if linear:
        key_heads, value_heads = k.integer("linear_num_key_heads"), k.integer("linear_num_value_heads")
        key_dim, value_dim = k.integer("linear_key_head_dim"), k.integer("linear_value_head_dim")
        kernel, state_dtype = k.integer("linear_conv_kernel_dim"), _dtype(k.cfg)
        # Gated DeltaNet (vllm: MambaStateShapeCalculator.gated_delta_net_state_shape): a conv state over
        # the q, k and v channels (key_heads x key_dim twice, value_heads x value_dim), and a recurrent state
        # of value_heads x value_dim x key_dim. Where the key and value dims differ the conv state is
        # described as two tensors, q|k then v: back to back in the slot they are the same bytes.
        conv = {"name": "conv", "dtype": state_dtype, "convKernel": kernel}
        convs = ([{**conv, "headGroups": [key_heads, key_heads, value_heads], "headShape": [key_dim]}]
                 if key_dim == value_dim else
                 [{**conv, "name": "conv-qk", "headGroups": [key_heads, key_heads], "headShape": [key_dim]},
                  {**conv, "name": "conv-v", "headGroups": [value_heads], "headShape": [value_dim]}])
        groups.append({"kind": "state", "name": "deltanet", "numLayers": linear, "tensors": [
            *convs, {"name": "recurrent", "dtype": state_dtype, "headGroups": [value_heads],
                     "headShape": [value_dim, key_dim]}]})
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


def _glm5_next(k: _Keys) -> list[dict]:
    """GLM-5-Next (GLM-5.3-Flash): NoPE MLA with, when `index_topk` is given, a pooled indexer and its fp32
    tail on the attention layers, KDA on the `linear_attention` layers, and `num_nextn_predict_layers` MTP
    layers of the attention kind."""
    # vllm-ascend's Glm5NextTextConfig.is_kda_layer: no layer_types, no KDA layer.
    mla_layers, kda_layers = _split_layers(
        k, frozenset({"indexed_attention", "full_attention", "deepseek_sparse_attention"}),
        lambda layers: layers)
    # linear_attn_config's keys win over the flat ones, which default as the class does.
    sub = k.nested("linear_attn_config") or {}
    flat = {"num_heads": "linear_num_heads", "head_dim": "linear_head_dim",
            "short_conv_kernel_size": "linear_conv_kernel_dim"}
    heads, head_dim, kernel = (
        _nested_int(sub, "linear_attn_config", nested) if nested in sub else k.integer(key)
        for nested, key in flat.items())
    k.resolved.update(zip(flat.values(), (heads, head_dim, kernel), strict=True))
    groups: list[dict] = []
    if mla_layers:
        mtp = k.integer("num_nextn_predict_layers", minimum=0)
        groups.append({**_mla(k, mla_layers)[0], "mtpLayers": mtp})
    if mla_layers and k.raw("index_topk") is not None:  # vllm-ascend's Glm5NextModel.is_v32
        kpool = k.integer("index_kpool")
        index_dim = k.integer("index_head_dim")
        # vllm-ascend keeps the pooled indexer in bf16 whatever the KV cache dtype, and a pool of one
        # token has no tail (`Glm5NextIndexerCache`, `Glm5NextTailCache` in glm5next/kv_cache.py).
        groups.append({"kind": "indexer", "name": "indexer", "numLayers": mla_layers, "mtpLayers": mtp,
                       "headDim": index_dim, "compressRatio": kpool, "dtype": "bfloat16"})
        if kpool > 1:
            groups.append({"kind": "indexerTail", "name": "indexer-tail", "numLayers": mla_layers,
                           "mtpLayers": mtp, "headDim": index_dim, "poolTokens": kpool})
    if kda_layers:
        groups.append(_kda_state(k.cfg, kda_layers, heads, head_dim, kernel))
    return groups


def _kimi_linear(k: _Keys) -> list[dict]:
    """Kimi Linear: MLA layers and KDA layers, listed 1-based in linear_attn_config.kda_layers. vLLM reads
    linear_attn_config's keys bare, and KimiLinearConfig refuses it without kda_layers and
    full_attn_layers."""
    layers = k.integer("num_hidden_layers")
    sub = k.nested("linear_attn_config")
    if sub is None:
        raise ConfigError(k._no_default("linear_attn_config"), "linear_attn_config")
    for key in ("kda_layers", "full_attn_layers"):
        listed = sub.get(key)
        if not isinstance(listed, list) or not all(type(i) is int for i in listed):
            raise ConfigError(f"config.json 'linear_attn_config.{key}' must list layer numbers (1-based)")
    kda = set(sub["kda_layers"])
    kda_layers = sum(1 for i in range(layers) if i + 1 in kda)
    groups = _mla(k, layers - kda_layers) if kda_layers < layers else []
    if kda_layers:
        dims = (_nested_int(sub, "linear_attn_config", key)
                for key in ("num_heads", "head_dim", "short_conv_kernel_size"))
        groups.append(_kda_state(k.cfg, kda_layers, *dims))
    return groups


ARCHITECTURES: dict[str, tuple[Callable[[_Keys], list[dict]], tuple[str, ...]]] = {
    **{arch: (_llama, (model_type,)) for arch, model_type in (
        ("LlamaForCausalLM", "llama"), ("MistralForCausalLM", "mistral"), ("MixtralForCausalLM", "mixtral"),
        ("Qwen2ForCausalLM", "qwen2"), ("Qwen2MoeForCausalLM", "qwen2_moe"), ("Qwen3ForCausalLM", "qwen3"),
        ("Qwen3MoeForCausalLM", "qwen3_moe"))},
    "DeepseekV2ForCausalLM": (_mla, ("deepseek_v2",)),
    "DeepseekV3ForCausalLM": (_mla, ("deepseek_v3",)),
    "DeepseekV32ForCausalLM": (_deepseek_sparse, ("deepseek_v32",)),
    "Qwen3NextForCausalLM": (_qwen3_next, ("qwen3_next",)),
    "Glm5NextForCausalLM": (_glm5_next, ("glm5_next", "glm5_next_text")),
    "Glm5NextForConditionalGeneration": (_glm5_next, ("glm5_next",)),
    "KimiLinearForCausalLM": (_kimi_linear, ("kimi_linear",)),
}
"""Architecture -> (its KV rule, the model_types whose config class we resolve for it)."""
SUPPORTED_ARCHITECTURES = tuple(sorted(ARCHITECTURES))


def _text_config(config: dict) -> dict:
    """The text model's keys: Glm5NextConfig nests them under `text_config` (transformers'
    `get_text_config`), whose absent keys take the text class's defaults, not the top level's keys."""
    nested = config.get("text_config")
    if nested is None:
        return config
    if not isinstance(nested, dict):
        raise ConfigError("config.json 'text_config' must be an object")
    return nested


def _resolve(config: Any) -> tuple[_Keys, Callable[[_Keys], list[dict]]]:
    if not isinstance(config, dict):
        raise ConfigError("config.json must be a JSON object")
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not archs:
        raise ConfigError("config.json has no 'architectures' list")
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise ConfigError(f"architecture {archs[0]} has no KV description rule (supported: "
                          f"{', '.join(SUPPORTED_ARCHITECTURES)}); give an explicit kv description")
    build, model_types = ARCHITECTURES[arch]
    model_type = config.get("model_type")
    if model_type not in model_types:
        # vLLM picks the config class, and so every default, by model_type.
        given = "has no 'model_type'" if model_type is None else f"'model_type' is {model_type!r}"
        raise ConfigError(f"config.json {given}; {arch} is read with model_type "
                          f"{' or '.join(map(repr, model_types))}, whose config class sets the defaults")
    text = _text_config(config)
    # The checkpoint's dtype may sit at the top level only.
    dtypes = {key: config[key] for key in ("dtype", "torch_dtype") if key in config and not text.get(key)}
    return _Keys({**text, **dtypes}, CONFIG_CLASSES[model_type], model_type), build


def resolved_keys(config: Any) -> dict[str, Any]:
    """Every key of the config class the reader reads for this config, with the value it resolved (after
    defaults; the flat name for a value Glm5NextTextConfig folds in from linear_attn_config). Raises
    ConfigError as model_from_hf_config does."""
    keys, build = _resolve(config)
    keys.integer("num_attention_heads")
    build(keys)
    return keys.resolved


def model_from_hf_config(config: Any, name: str) -> ModelKV:
    """Raises ConfigError (a ValueError) with a one-line reason for configs it cannot describe."""
    keys, build = _resolve(config)
    heads = keys.integer("num_attention_heads")
    try:
        return ModelKV.model_validate({"name": name, "dtype": _dtype(keys.cfg), "attentionHeads": heads,
                                       "groups": build(keys)})
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError(f"config.json gives an invalid shape: {first['msg']} at "
                          f"{'.'.join(map(str, first['loc']))}") from None

"""Run vLLM's own start-up config code on model configs and report the engine block or the refusal.

Runs inside `.vllm-venv` (vLLM 0.34, CPU torch), started by tests/kv/test_vllm_blocksize.py and
test_vllm_differential.py. Reads a JSON list of cases on stdin and prints one JSON object per case:
{"id": ..., "block": ..., "paddedStatePage": ..., "mambaCacheMode", "mambaBlockSize", "maxModelLen",
"stateSlotsPerRequest", "hitTokens"} or {"id": ..., "refused": "<exception>: <message>"}.

A case is {"id", "config" (a config.json object, or "folder": a directory holding one), "dtype", "tp",
"kernel", "blockSize" (null: not given), "kvCacheDtype", "specTokens", "platform": "vllm" | "ascend"},
and optionally "maxModelLen" (default 4096), "prefixCaching" (default false), and "measure": true (also
report what `measure` says and the values vLLM's config holds for "keys": {"resolved": {key: value}}, keys
it does not hold left out) or "configOnly": true (only vLLM's config loading, for models whose classes
cannot be resolved here: {"id", "resolved"} or {"id", "refused"}).

Real vLLM objects throughout: ModelConfig reading the config.json, ParallelConfig, CacheConfig (prefix
caching as the case asks, as the operator renders `--enable-prefix-caching` or `--no-enable-prefix-caching`),
VllmConfig with all its __post_init__
checks, the model class vLLM resolves and its state-shape calculators, and
`Platform.update_block_size_for_backend` (phase 1 default block, hybrid alignment, the aligned-size check).
Two things vLLM only learns from a running engine stand in:
- the attention backend: a backend declaring the case's kernel block (128 on Ascend) is what
  `_find_non_ssm_backends` returns; `get_supported_kernel_block_sizes` is all the code asks of it;
- the speculative config: only `num_speculative_tokens` is read by the state-shape code, so a plain object
  carries it (a real SpeculativeConfig needs a draft model).
With no model layers instantiated, vLLM's final rounding to every attention layer's kernel block (an lcm over
the layers) is a no-op, and so is align mode's prefill checkpoint alignment (an lcm over the state layers that
export checkpoints): no layer the case's platform runs declares one (only GDN with FlashInfer on CUDA does).

What a block costs comes from vLLM's own classes too: the state slots a running request holds are
`MambaSpec.max_memory_usage_bytes` over the page size, for the spec a state layer builds from the resolved
config (`MambaBase.get_kv_cache_spec`: mamba_block_size, padded page, cache mode, one block per draft token);
where prefix-cache hits land is `resolve_kv_cache_block_sizes` and `resolve_cache_hit_alignment_tokens` on an
attention group and that state group.

`platform: "ascend"` runs vllm-ascend 0.30.0rc2's own code from its source archive (`--ascend-src DIR`):
`vllm_ascend/patch/platform/patch_mamba_config.py` (the pooled-indexer block rule) is executed as it is,
with the three helpers it imports (`model_uses_kpool_indexer`, `model_uses_sfa_sparse`,
`get_sfa_qsfa_packed_head_dim`) compiled from their real source files; only
`NPUPlatform._align_hybrid_block_size` (vllm_ascend/platform.py, which imports torch_npu) is transcribed
below, with its source cited.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _load_functions(path: Path, names: set[str], namespace: dict) -> None:
    """Compile the named top-level functions of a source file into `namespace` (their own code, unchanged)."""
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = names - {n.name for n in nodes}
    if missing:
        raise SystemExit(f"{path} has no {', '.join(sorted(missing))}")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)


def install_glm5next_config(src: Path) -> None:
    """vllm-ascend's GLM-5.3-Flash config classes, as `vllm_ascend.patch.platform` installs them: its
    `patch_glm5next_config.py` is executed as it is, over `vllm_ascend/models/glm5next/config.py` (which
    imports transformers alone); it registers them in vLLM's config registry for `glm5_next` and
    `glm5_next_text`."""
    for name in ("vllm_ascend", "vllm_ascend.models", "vllm_ascend.models.glm5next"):
        package = sys.modules.setdefault(name, types.ModuleType(name))
        package.__path__ = getattr(package, "__path__", [])  # type: ignore[attr-defined]
    for name, path in (("vllm_ascend.models.glm5next.config", "vllm_ascend/models/glm5next/config.py"),
                       ("vllm_ascend.patch.platform.patch_glm5next_config",
                        "vllm_ascend/patch/platform/patch_glm5next_config.py")):
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile((src / path).read_text(), str(src / path), "exec"), module.__dict__)


def install_vllm_ascend(src: Path) -> None:
    """vllm-ascend's pooled-indexer block rule, as `vllm_ascend.patch.platform` applies it: its module
    replaces `HybridAttentionMambaModelConfig.verify_and_update_config`."""
    import torch
    from vllm.utils.torch_utils import get_dtype_size

    package = types.ModuleType("vllm_ascend")
    package.__path__ = []  # type: ignore[attr-defined]
    utils = types.ModuleType("vllm_ascend.utils")
    utils.__dict__["Any"] = object
    _load_functions(src / "vllm_ascend/utils.py", {"model_uses_kpool_indexer", "model_uses_sfa_sparse"},
                    utils.__dict__)
    attention = types.ModuleType("vllm_ascend.attention")
    attention.__path__ = []  # type: ignore[attr-defined]
    attention_utils = types.ModuleType("vllm_ascend.attention.utils")
    tree = ast.parse((src / "vllm_ascend/attention/utils.py").read_text())
    tile = next(n for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", "") == "SFA_QSFA_TILE_SIZE" for t in n.targets))
    attention_utils.__dict__.update(torch=torch, get_dtype_size=get_dtype_size,
                                    SFA_QSFA_TILE_SIZE=ast.literal_eval(tile.value))
    _load_functions(src / "vllm_ascend/attention/utils.py", {"get_sfa_qsfa_packed_head_dim"},
                    attention_utils.__dict__)
    sys.modules.update({"vllm_ascend": package, "vllm_ascend.utils": utils,
                        "vllm_ascend.attention": attention, "vllm_ascend.attention.utils": attention_utils})
    path = src / "vllm_ascend/patch/platform/patch_mamba_config.py"
    module = types.ModuleType("vllm_ascend.patch.platform.patch_mamba_config")
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)


def install_probe_platform():
    """A platform whose only behaviour is vLLM's base `Platform` (the CPU platform's own start-up hook is
    about CPU kernels, not about the model), with the case's attention backend. Installed as vLLM's current
    platform before `vllm.config` binds it."""
    import vllm.platforms
    from vllm.platforms.interface import Platform, PlatformEnum
    from vllm.v1.attention.backend import AttentionBackend

    class ProbePlatform(Platform):
        _enum = PlatformEnum.OOT
        device_name = "cpu"
        device_type = "cpu"
        dispatch_key = "CPU"
        kernel = 128
        ascend = False

        @classmethod
        def _find_non_ssm_backends(cls, vllm_config):
            kernel = cls.kernel

            class KernelBlockBackend(AttentionBackend):  # type: ignore[misc]
                @staticmethod
                def get_supported_kernel_block_sizes(kv_cache_spec=None):
                    return [kernel]

                @staticmethod
                def get_name() -> str:
                    return f"KERNEL_{kernel}"

            return [KernelBlockBackend]

        @classmethod
        def _align_hybrid_block_size(cls, vllm_config, backend_cls) -> None:
            if cls.ascend:
                # vllm-ascend 0.30.0rc2 vllm_ascend/platform.py, NPUPlatform._align_hybrid_block_size (that
                # module imports torch_npu): C8 on a pooled-indexer MLA model reruns its own rule, anything
                # else runs vLLM's.
                from vllm.model_executor.models.config import HybridAttentionMambaModelConfig
                from vllm_ascend.utils import model_uses_kpool_indexer

                if (vllm_config.model_config.use_mla
                        and vllm_config.cache_config.cache_dtype in ("int8", "fp8")
                        and model_uses_kpool_indexer(vllm_config.model_config)):
                    HybridAttentionMambaModelConfig.verify_and_update_config(vllm_config)
                    return
            super()._align_hybrid_block_size(vllm_config, backend_cls)

    vllm.platforms.current_platform = ProbePlatform()
    return ProbePlatform


def refusal(err: Exception) -> str:
    message = " ".join(str(err).split())
    return f"{type(err).__name__}: {message[:400]}"


def _jsonable(value):
    return value if isinstance(value, (int, float, str, bool, list, dict, type(None))) else repr(value)


def resolved_keys(text_config, keys: list[str]) -> dict:
    """The values vLLM's config object holds for `keys` (keys it does not hold are left out)."""
    return {key: _jsonable(getattr(text_config, key)) for key in keys if hasattr(text_config, key)}


def measure(config) -> dict:
    """What vLLM's own code makes of the model on one rank: the attention page of one token and one layer
    (as `Platform._align_hybrid_block_size` computes it), the unpadded state of one layer and one request
    (the model class's state-shape and state-dtype calculators), and its attention and state layers."""
    from math import prod

    from vllm.model_executor.models import ModelRegistry
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, get_dtype_size
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, get_kv_quant_mode

    model_config, parallel, cache = config.model_config, config.parallel_config, config.cache_config
    kv_dtype = (model_config.dtype if cache.cache_dtype == "auto"
                else STR_DTYPE_TO_TORCH_DTYPE[cache.cache_dtype])
    common = {"block_size": 1, "num_kv_heads": model_config.get_num_kv_heads(parallel),
              "head_size": model_config.get_head_size(), "dtype": kv_dtype,
              "kv_quant_mode": get_kv_quant_mode(cache.cache_dtype)}
    attention = (MLAAttentionSpec(**common, cache_dtype_str=cache.cache_dtype) if model_config.use_mla
                 else FullAttentionSpec(**common))
    out = {"attnBytesPerToken": attention.page_size_bytes, "stateBytes": 0}
    text = model_config.hf_text_config
    if not model_config.is_hybrid:
        return {**out, "attentionLayers": model_config.get_num_layers_by_block_type(parallel, "attention")}
    model_cls, _ = ModelRegistry.resolve_model_cls(model_config.architecture, model_config=model_config)
    shapes = model_cls.get_mamba_state_shape_from_config(config)
    dtypes = model_cls.get_mamba_state_dtype_from_config(config)
    out["stateBytes"] = sum(prod(shape) * get_dtype_size(dtype)
                            for shape, dtype in zip(shapes, dtypes, strict=True))
    if hasattr(text, "is_kda_layer"):  # Kimi Linear: layers by its config's own per-layer test
        out["stateLayers"] = sum(text.is_kda_layer(i) for i in range(text.num_hidden_layers))
        return {**out, "attentionLayers": text.num_hidden_layers - out["stateLayers"]}
    return {**out, "attentionLayers": model_config.get_num_layers_by_block_type(parallel, "attention"),
            "stateLayers": model_config.get_num_layers_by_block_type(parallel, "linear_attention")}


def config_only(folder: Path, keys: list[str]) -> dict:
    """vLLM's config loading alone (`get_config`), for models whose classes cannot be resolved here (with
    vllm-ascend's GLM-5.3-Flash config classes registered, `install_glm5next_config`)."""
    from vllm.transformers_utils.config import get_config

    text = get_config(str(folder), trust_remote_code=False).get_text_config()
    return {"resolved": resolved_keys(text, keys)}


def block_costs(config) -> dict:
    """What the resolved blocks cost, asked of vLLM's own spec classes (see the module docstring)."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.core.kv_cache_utils import resolve_cache_hit_alignment_tokens, resolve_kv_cache_block_sizes
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        MLAAttentionSpec,
    )

    cache, model = config.cache_config, config.model_config
    attention_spec = MLAAttentionSpec if model.use_mla else FullAttentionSpec
    attention = attention_spec(block_size=cache.block_size, num_kv_heads=1, head_size=model.get_head_size(),
                               dtype=model.dtype)
    groups = [KVCacheGroupSpec(["attention"], attention)]
    slots = 0
    if model.is_hybrid:
        model_cls, _ = ModelRegistry.resolve_model_cls(model.architecture, model_config=model)
        state = MambaSpec(shapes=model_cls.get_mamba_state_shape_from_config(config),
                          dtypes=model_cls.get_mamba_state_dtype_from_config(config),
                          block_size=cache.mamba_block_size, page_size_padded=cache.mamba_page_size_padded,
                          mamba_cache_mode=cache.mamba_cache_mode,
                          num_speculative_blocks=config.num_speculative_tokens)
        groups.append(KVCacheGroupSpec(["state"], state))
        slots = state.max_memory_usage_bytes(config) // state.page_size_bytes
    kv_cache = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=groups)
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(kv_cache, config)
    return {"mambaCacheMode": cache.mamba_cache_mode,
            "mambaBlockSize": cache.mamba_block_size, "maxModelLen": model.max_model_len,
            "stateSlotsPerRequest": slots,
            "hitTokens": resolve_cache_hit_alignment_tokens(kv_cache, config, scheduler_block, hash_block)
            if cache.enable_prefix_caching else None}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ascend-src", type=Path)
    args = parser.parse_args()
    cases = json.loads(sys.stdin.read())
    platform = install_probe_platform()
    from vllm.model_executor.models.config import HybridAttentionMambaModelConfig

    hooks = {"vllm": HybridAttentionMambaModelConfig.__dict__["verify_and_update_config"]}
    if any(c.get("configOnly") for c in cases):
        if args.ascend_src is None:
            raise SystemExit("config-only cases need --ascend-src (vllm-ascend's GLM config classes)")
        install_glm5next_config(args.ascend_src)
    if any(c.get("platform") == "ascend" for c in cases):
        if args.ascend_src is None:
            raise SystemExit("ascend cases need --ascend-src (vllm-ascend's unpacked source archive)")
        install_vllm_ascend(args.ascend_src)
        hooks["ascend"] = HybridAttentionMambaModelConfig.__dict__["verify_and_update_config"]

    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig
    from vllm.transformers_utils import repo_utils

    # vLLM retries a failed config read after 2 s, for transient hub failures; a local config.json fails the
    # same way again, so the wait is dropped (the read and its retry still run).
    repo_utils.time = SimpleNamespace(sleep=lambda _seconds: None)

    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            platform.kernel, platform.ascend = case["kernel"], case.get("platform") == "ascend"
            # vLLM's hook for plain-vLLM cases, vllm-ascend's replacement for Ascend ones.
            HybridAttentionMambaModelConfig.verify_and_update_config = hooks[case.get("platform", "vllm")]
            folder = case.get("folder")
            if folder is None:
                folder = Path(tmp) / case["id"]
                folder.mkdir()
                (folder / "config.json").write_text(json.dumps(case["config"]))
            kv_cache_dtype = case.get("kvCacheDtype", "auto")
            if case.get("configOnly"):
                try:
                    result = {"id": case["id"], **config_only(folder, case.get("keys", []))}
                except Exception as err:
                    result = {"id": case["id"], "refused": refusal(err)}
                print(json.dumps(result), flush=True)
                continue
            try:
                model = ModelConfig(model=str(folder), skip_tokenizer_init=True,
                                    max_model_len=case.get("maxModelLen", 4096),
                                    dtype=case.get("dtype", "auto"))
                config = VllmConfig(
                    model_config=model,
                    parallel_config=ParallelConfig(tensor_parallel_size=case["tp"]),
                    cache_config=CacheConfig(block_size=case.get("blockSize"),
                                             cache_dtype="auto" if platform.ascend else kv_cache_dtype,
                                             enable_prefix_caching=case.get("prefixCaching", False)),
                    device_config=DeviceConfig(device="cpu"),
                )
                if case.get("specTokens"):
                    object.__setattr__(config, "speculative_config",
                                       SimpleNamespace(num_speculative_tokens=case["specTokens"]))
                if platform.ascend:
                    # vllm-ascend 0.30 runs on vLLM 0.30, whose CacheConfig it widens to int8 and whose block
                    # size is None when not given; its rule ran in __post_init__ above without the KV dtype
                    # and the draft tokens, so it runs again with them, as it would have at that point.
                    config.cache_config.cache_dtype = kv_cache_dtype
                    config.cache_config.block_size = case.get("blockSize")
                    HybridAttentionMambaModelConfig.verify_and_update_config(config)
                platform.update_block_size_for_backend(config)
                result = {"id": case["id"], "block": config.cache_config.block_size,
                          "paddedStatePage": config.cache_config.mamba_page_size_padded}
                result.update(block_costs(config))
                if case.get("measure"):
                    result.update(measure(config),
                                  resolved=resolved_keys(config.model_config.hf_text_config,
                                                         case.get("keys", [])))
            except Exception as err:  # vLLM refused the configuration: report why
                result = {"id": case["id"], "refused": refusal(err)}
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

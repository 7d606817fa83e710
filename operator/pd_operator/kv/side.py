"""One side of a pairing (prefill or decode): the model, its parallel shape and cache settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pd_operator.kv.dtypes import is_fp8, resolve_cache_dtype
from pd_operator.kv.model import ModelKV

Role = Literal["prefill", "decode"]
Platform = Literal["ascend", "vllm"]
"""Whose block rule a side runs: vllm-ascend's (a serving image) or plain vLLM's (vLLM's own code)."""
PLATFORMS: tuple[Platform, ...] = ("ascend", "vllm")

# Ascend attention kernels page KV in 128-token kernel blocks (vllm-ascend: `vllm_ascend/attention/mla_v1.py`
# and `sfa_v1.py` @ 0.30.0rc2, `get_supported_kernel_block_sizes` -> [128]).
ASCEND_KERNEL_BLOCK = 128


@dataclass(frozen=True)
class Side:
    role: Role
    model: ModelKV
    tensor_parallel: int
    data_parallel: int = 1
    pipeline_parallel: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    """vLLM's --block-size: a request; hybrid unification may raise it."""
    kernel_block_size: int = ASCEND_KERNEL_BLOCK
    num_speculative_tokens: int = 0
    path: str = ""
    """Manifest path of this role, e.g. `spec.prefill`, used in findings."""
    platform: Platform = "ascend"
    model_path: str = ""
    """Manifest path of the model settings (`spec.model`), for findings on dtypes; else `path`."""
    prefix_caching: bool = False
    """vLLM's --enable-prefix-caching; for a hybrid model it runs the state cache in vLLM's "align"
    mode (kv/blocksize.py)."""

    @property
    def engine_kv_cache_dtype(self) -> str:
        """--kv-cache-dtype as the engine keeps it: vLLM 0.34 turns bfloat16 into auto for DeepSeek-V3.2
        (`vllm/model_executor/models/config.py`, DeepseekV32ForCausalLM.verify_and_update_config), the
        model with V3.2's fp8 indexer (one entry per token). Whether vllm-ascend's base vLLM does the same
        is not checked here, so the Ascend side keeps the flag as given."""
        v32 = any(g.kind == "indexer" and is_fp8(g.dtype or "") and g.compress_ratio == 1
                  for g in self.model.groups)
        if self.platform == "vllm" and v32 and self.kv_cache_dtype.lower() == "bfloat16":
            return "auto"
        return self.kv_cache_dtype

    @property
    def cache_dtype(self) -> str:
        return resolve_cache_dtype(self.engine_kv_cache_dtype, self.model.dtype)

    def field(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def model_field(self, name: str) -> str:
        return f"{self.model_path}.{name}" if self.model_path else self.field(name)


def prefix_caching_on(asked: bool | None, model: ModelKV) -> bool:
    """Whether an engine caches prefixes: as asked, else what the operator renders when nothing is asked,
    off for hybrid models (render/command.py) and vLLM's default, on, for the others."""
    return asked if asked is not None else not model.is_hybrid

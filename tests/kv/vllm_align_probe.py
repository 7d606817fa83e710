"""Run vLLM's own hybrid page-size unification (`Platform._align_hybrid_block_size`) on config.json folders.

Runs inside `.vllm-venv` (vLLM 0.34, CPU torch), started by test_vllm_blocksize.py. Reads a JSON list of
cases from argv[1] ({"folder", "tp", "kernel", "blockSize", "specTokens"}) and prints one JSON object per
case: {"case": ..., "block": ..., "paddedStatePage": ...} or {"case": ..., "error": ...}.

Real vLLM objects throughout (ModelConfig reading the folder, ParallelConfig, CacheConfig, VllmConfig, the
model class vLLM resolves for the architecture and its state-shape calculators) except two things vLLM
only learns from a running engine:
- the attention backend: vllm-ascend is not importable here, so a backend declaring the Ascend kernel
  block (or the case's kernel) stands in; `get_supported_kernel_block_sizes` is all the function asks;
- the speculative config: only `num_speculative_tokens` is read by the state-shape code, so a plain
  object carries it (a real SpeculativeConfig needs a draft model).
Prefix caching is off, so `mamba_cache_mode` is `none`, the mode the operator models. With no model layers
instantiated, vLLM's final rounding to every attention layer's kernel block (an lcm over the layers) is a
no-op, so the cases request only block sizes that are multiples of the kernel block.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backend import AttentionBackend

    def backend_with_kernel(kernel: int) -> type[AttentionBackend]:
        class KernelBlockBackend(AttentionBackend):  # type: ignore[misc]
            @staticmethod
            def get_supported_kernel_block_sizes(kv_cache_spec=None):
                return [kernel]

        return KernelBlockBackend

    for case in json.loads(sys.argv[1]):
        try:
            model = ModelConfig(model=case["folder"], skip_tokenizer_init=True, max_model_len=4096)
            # Without --block-size vLLM first picks the backend's smallest kernel block (phase 1 of
            # Platform.update_block_size_for_backend).
            requested = case.get("blockSize") or case["kernel"]
            config = VllmConfig(
                model_config=model,
                parallel_config=ParallelConfig(tensor_parallel_size=case["tp"]),
                cache_config=CacheConfig(block_size=requested, enable_prefix_caching=False),
                device_config=DeviceConfig(device="cpu"),
            )
            if case.get("specTokens"):
                object.__setattr__(config, "speculative_config",
                                   SimpleNamespace(num_speculative_tokens=case["specTokens"]))
            Platform._align_hybrid_block_size(config, backend_with_kernel(case["kernel"]))
            result = {"case": case, "block": config.cache_config.block_size,
                      "paddedStatePage": config.cache_config.mamba_page_size_padded}
        except Exception as err:  # reported to the test, which fails with the reason
            result = {"case": case, "error": f"{type(err).__name__}: {err}"}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

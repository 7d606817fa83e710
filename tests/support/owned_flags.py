"""Spellings of the operator's own `vllm serve` flags that vLLM 0.34's parser reads as them.

vLLM's FlexibleArgumentParser turns `_` into `-` in long option names and reads `--flag.key v` as
one key of the JSON flag `--flag`; argparse takes `--flag=v` and, with allow_abbrev (which vLLM
keeps), any unambiguous prefix of an option. test_overrides_vllm.py checks with vLLM's own parser
that each spelling here does set the owned value.
"""

from __future__ import annotations

from pd_operator.spec.reserved import OWNED_FLAGS

# A value of the right type that differs from every rendered one, per owned flag (None: no value).
VALUES: dict[str, str | None] = {
    "--tensor-parallel-size": "3", "-tp": "3",
    "--data-parallel-size": "3", "-dp": "3",
    "--pipeline-parallel-size": "3", "-pp": "3",
    "--data-parallel-size-local": "3", "-dpl": "3",
    "--data-parallel-start-rank": "3", "-dpr": "3",
    "--data-parallel-address": "10.9.9.9", "-dpa": "10.9.9.9",
    "--data-parallel-rpc-port": "4242", "-dpp": "4242",
    "--headless": None,
    "--block-size": "16",
    "--kv-transfer-config": '{"kv_connector":"MooncakeConnectorV2","kv_role":"kv_consumer"}',
    "--port": "9999",
    "--api-key": "user-key",
    "--host": "127.0.0.1",
    "--dtype": "float16",
    "--kv-cache-dtype": "fp8",
    "--served-model-name": "someone-else",
    "--max-model-len": "77",
    "--kv-events-config": '{"enable_kv_cache_events":true,"endpoint":"tcp://*:7777"}',
}


def spellings(flag: str) -> list[list[str]]:
    """extraArgs lists that set `flag` under each spelling vLLM accepts."""
    value = VALUES[flag]
    tail = [] if value is None else [value]
    out = [[flag, *tail]]
    if value is not None:
        out.append([f"{flag}={value}"])
    if flag.startswith("--"):
        out.append([flag.replace("-", "_").replace("__", "--", 1), *tail])
        # The shortest prefix no other option of vLLM shares is checked with vLLM; a few letters
        # short of the full name is unambiguous for every owned flag.
        out.append([flag[:-2], *tail])
    if flag == "--kv-transfer-config":
        out.append(["--kv-transfer-config.kv_role", "kv_consumer"])
        out.append(["--kv_transfer_config.kv_port=1"])
    return out


# Flags a user legitimately passes; none of them may be refused.
FREE_ARGS = [["--enforce-eager"], ["--max-num-seqs=8"], ["--gpu-memory-utilization", "0.9"], ["-O3"],
             ["--trust-remote-code"],
             ["--compilation-config.cudagraph_mode", "NONE"], ["--max-num-batched-tokens", "8192"],
             ["--quantization", "ascend"], ["-q", "ascend"], ["--seed", "7"]]


# Owned for hybrid models (the operator renders prefix caching off for them unless
# spec.<role>.enablePrefixCaching asks, render/command.py) and wherever that field is set; free otherwise.
HYBRID_OWNED_ARGS = [["--enable-prefix-caching"], ["--no-enable-prefix-caching"], ["--enable-prefix"]]


def covers_every_owned_flag() -> bool:
    return set(VALUES) == set(OWNED_FLAGS)

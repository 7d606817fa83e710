"""What the operator sets on serving pods itself, so user env and extraArgs cannot silently change it.

The renderer sets exactly these; the validator reports a user value for any of them (EnvOverride,
ArgOverride) and names the spec field that controls it instead.
"""

from __future__ import annotations

# Env var -> the spec field (or reason) that controls it.
OWNED_ENV: dict[str, str] = {
    "VLLM_USE_V2_MODEL_RUNNER": "spec.image and the model (the runner the image runs the model family on)",
    "VLLM_HOST_IP": "the pod IP (status.podIP)",
    "HCCL_IF_IP": "the pod IP (status.podIP)",
    "GLOO_SOCKET_IFNAME": "the pod network interface",
    "TP_SOCKET_IFNAME": "the pod network interface",
    "HCCL_SOCKET_IFNAME": "the pod network interface",
    "MC_MIN_RPC_PORT": "the operator's port plan",
    "MC_MAX_RPC_PORT": "the operator's port plan",
    "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT": "spec.kvTransfer.timeouts.abortRequestSeconds",
    "ASCEND_TRANSFER_TIMEOUT": "spec.kvTransfer.timeouts.transferMs",
    "ASCEND_CONNECT_TIMEOUT": "spec.kvTransfer.timeouts.connectMs",
    "PD_POD_INDEX": "the pod's ordinal in its instance (downward API)",
    "VLLM_API_KEY": "spec.proxy.apiKey",
}

# Defaults the user may override through env without a finding.
DEFAULT_ENV: dict[str, str] = {
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "OMP_NUM_THREADS": "1",
    "HCCL_BUFFSIZE": "1024",
    "MC_LOG_LEVEL": "WARNING",
}

# vllm serve flag (and its aliases) -> the spec field that controls it (`{role}`: the pod's role).
OWNED_FLAGS: dict[str, str] = {
    "--tensor-parallel-size": "spec.{role}.tensorParallelSize",
    "-tp": "spec.{role}.tensorParallelSize",
    "--data-parallel-size": "spec.{role}.dataParallelSize",
    "-dp": "spec.{role}.dataParallelSize",
    "--pipeline-parallel-size": "spec.{role}.pipelineParallelSize",
    "-pp": "spec.{role}.pipelineParallelSize",
    "--data-parallel-size-local": "the operator's pod plan",
    "-dpl": "the operator's pod plan",
    "--data-parallel-start-rank": "the operator's pod plan",
    "-dpr": "the operator's pod plan",
    "--data-parallel-address": "the operator's pod plan",
    "-dpa": "the operator's pod plan",
    "--data-parallel-rpc-port": "the operator's port plan",
    "-dpp": "the operator's port plan",
    "--headless": "the operator's pod plan",
    "--block-size": "spec.{role}.blockSize",
    "--kv-transfer-config": "spec.kvTransfer",
    "--port": "spec.servingPort",
    "--host": "the operator (all interfaces)",
    "--dtype": "spec.model.dtype",
    "--kv-cache-dtype": "spec.model.kvCacheDtype",
    "--served-model-name": "spec.model.servedModelName",
    "--max-model-len": "spec.model.maxModelLen",
    "--api-key": "spec.proxy.apiKey (the proxy sends the engines that key)",
    "--kv-events-config": "spec.proxy.routing (precise prefix routing publishes prefill's KV events)",
}


# Rendered from spec.{role}.enablePrefixCaching, and off for hybrid models without it (render/command.py
# says why); extraArgs may not touch them where they are rendered.
PREFIX_CACHING_ON = "--enable-prefix-caching"
PREFIX_CACHING_OFF = "--no-enable-prefix-caching"
PREFIX_CACHING_FLAGS = (PREFIX_CACHING_ON, PREFIX_CACHING_OFF)
# vLLM 0.34 asserts chunked prefill for a hybrid model's prefix caching ("Chunked prefill is required for
# Mamba prefix caching.", vllm: `vllm/model_executor/models/config.py`, MambaModelConfig).
CHUNKED_PREFILL_OFF = "--no-enable-chunked-prefill"


def flag_name(arg: str) -> str | None:
    """The option a word names, spelled the way vLLM's parser reads it: `--block_size=128` ->
    `--block-size`, `--kv-transfer-config.kv_role` -> `--kv-transfer-config`; values and positional
    words -> None. (vLLM 0.34 FlexibleArgumentParser.parse_args turns `_` into `-` in long option
    names, and `--flag.key value` sets one key of the JSON flag `--flag`.)"""
    if not arg.startswith("-"):
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = name.split(".", 1)[0].replace("_", "-")
    return name


def owned_flag(arg: str) -> str | None:
    """The owned flag an extraArgs word sets, or None.

    argparse (allow_abbrev, which vLLM keeps) also takes any unambiguous prefix of an option, so
    `--tensor-parallel 2` or `-t 2` set the tensor parallel size: a prefix of an owned flag counts
    as that flag. A prefix that is ambiguous makes vLLM exit, so refusing it costs nothing.
    """
    name = flag_name(arg)
    if name is None or name.strip("-") == "":
        return None
    if name in OWNED_FLAGS:
        return name
    return next((flag for flag in OWNED_FLAGS if flag.startswith(name)), None)

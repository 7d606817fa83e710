"""Prefill/decode KV compatibility: every rule that vLLM, vllm-ascend or the connector would trip at
worker start-up or mid-transfer, checked from the description alone.

`check_pair` is the one entry point; the CLI, the admission webhook and the controller call it
through the manifest validator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd

from pd_operator.findings import Finding, is_compatible
from pd_operator.kv.blocksize import SideLayout, side_layout, vllm_block_size
from pd_operator.kv.dtypes import canonical_dtype
from pd_operator.kv.model import IndexerGroup
from pd_operator.kv.pages import LayoutError, StateGroupLayout, TailGroupLayout, c8_packed
from pd_operator.kv.side import Side
from pd_operator.kv.transfer_plan import PlanError, TransferPlan, plan_transfer

# vllm-ascend's push-mode connector (V1): it maps unequal logical blocks at kernel granularity, but
# only splits state from a larger prefill TP into a smaller decode TP.
V1_CONNECTORS = frozenset({"MooncakeConnectorV1", "MooncakeConnector"})
# vllm-ascend's V1 connector reads the remote state block by the local cache mode: in "align" mode it wants
# exactly one (the producer's normalized block), in "none" mode the one before the speculative tail
# (vllm-ascend: `kv_p2p/mooncake_connector.py` @ 0.30.0rc2, KVCacheRecvingThread and
# MooncakeConnectorScheduler._get_transfer_block_ids). With draft tokens, sides in different modes fail.
V1_MIXED_STATE_ERRORS = {
    "none": "Invalid non-aligned Mamba state block metadata",
    "align": "Mooncake Mamba transfer requires exactly one normalized remote state block",
}
# KV cache dtypes vLLM 0.34 accepts that the operator models (vllm: `vllm/config/cache.py`, CacheDType);
# vllm-ascend widens the list with int8 (vllm-ascend: `vllm_ascend/patch/platform/patch_kv_cache_dtype.py`
# @ 0.30.0rc2).
VLLM_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
ASCEND_KV_CACHE_DTYPES = (*VLLM_KV_CACHE_DTYPES, "int8")
# Mean run size below which Mooncake tcp throughput collapses: ~0.07 GB/s at 4 KB entries versus
# ~1 GB/s from 64 KB (observed over loopback with mooncake-transfer-engine-non-cuda 0.3.13.post1, 2 cores).
SMALL_RUN_BYTES = 64 * 1024
DEFAULT_PROMPT_TOKENS = 8192


@dataclass(frozen=True)
class PairReport:
    prefill: Side
    decode: Side
    findings: list[Finding] = field(default_factory=list)
    prefill_layout: SideLayout | None = None
    decode_layout: SideLayout | None = None
    plan: TransferPlan | None = None

    @property
    def compatible(self) -> bool:
        return is_compatible(self.findings)

    @property
    def segment_tokens(self) -> int | None:
        if self.prefill_layout is None or self.decode_layout is None:
            return None
        return gcd(self.prefill_layout.engine_block_size, self.decode_layout.engine_block_size)


def check_pair(prefill: Side, decode: Side, *, connector: str = "MooncakeConnectorV2",
               prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
               connector_path: str = "spec.kvTransfer.connector") -> PairReport:
    findings = _identity(prefill, decode)
    if decode.pipeline_parallel > 1:
        findings.append(Finding(
            "DecodePipelineParallel", "error", decode.field("pipelineParallelSize"), "",
            f"Decode pipeline parallel is {decode.pipeline_parallel}; the Mooncake connector pulls "
            "KV into one pipeline stage only, so set it to 1 and scale decode with tensor or data "
            "parallel instead."))
    findings += list(dict.fromkeys(f for side in (prefill, decode) for f in _config_rules(side)))
    layouts = []
    for side in (prefill, decode):
        try:
            layout = side_layout(side)
        except LayoutError as err:
            finding = Finding(err.code, "error", err.field, err.group, str(err))
            if finding not in findings:  # a model-wide cause (the KV dtype) fails both sides alike
                findings.append(finding)
            continue
        findings += _side_rules(layout)
        layouts.append(layout)
    if len(layouts) < 2:
        return PairReport(prefill, decode, findings)
    if prefill.model.groups != decode.model.groups:  # ModelMismatch said why; pairing groups is moot
        return PairReport(prefill, decode, findings, layouts[0], layouts[1])
    p_layout, d_layout = layouts
    findings += _pair_rules(p_layout, d_layout, connector, connector_path)
    plan = None
    if is_compatible(findings):
        try:
            plan = plan_transfer(p_layout, d_layout, prompt_tokens)
        except PlanError as err:  # every cause has a rule above; this keeps the verdict honest
            findings.append(Finding("ShardedTPIncompatible", "error", decode.field("tensorParallelSize"),
                                    "", f"The transfer cannot be planned: {err}."))
        else:
            findings += _run_size_rules(plan, decode)
    return PairReport(prefill, decode, findings, p_layout, d_layout, plan)


def _identity(prefill: Side, decode: Side) -> list[Finding]:
    out = []
    if prefill.model.name != decode.model.name:
        out.append(Finding("ModelMismatch", "error", decode.field("model"), "",
                           f"Prefill serves {prefill.model.name} but decode serves {decode.model.name}; "
                           "KV caches only transfer between instances of the same model."))
    elif prefill.model.groups != decode.model.groups:
        out.append(Finding("ModelMismatch", "error", decode.field("model"), "",
                           f"Prefill and decode both name {prefill.model.name} but describe its KV cache "
                           "groups differently; give both roles the same model description."))
    if canonical_dtype(prefill.model.dtype) != canonical_dtype(decode.model.dtype):
        out.append(Finding("DTypeMismatch", "error", decode.field("dtype"), "",
                           f"Prefill runs in {prefill.model.dtype} but decode in {decode.model.dtype}; "
                           "use the same dtype on both roles."))
    if prefill.cache_dtype != decode.cache_dtype:
        out.append(Finding("KVCacheDTypeMismatch", "error", decode.field("kvCacheDtype"), "",
                           f"Prefill stores KV as {prefill.cache_dtype} but decode as {decode.cache_dtype}; "
                           "the bytes would be misread, so use the same kvCacheDtype on both roles."))
    return out


def _config_rules(side: Side) -> list[Finding]:
    """What vLLM's and vllm-ascend's config classes refuse before any layer exists."""
    out = []
    heads, tp = side.model.attention_heads, side.tensor_parallel
    if heads and heads % tp:
        # vllm: `vllm/config/model.py` @ 0.34.0, ModelConfig.verify_with_parallel_config.
        out.append(Finding(
            "HeadsNotDivisibleByTP", "error", side.field("tensorParallelSize"), "",
            f"vLLM refuses TP {tp} for a model with {heads} attention heads at start-up ('Total number of "
            f"attention heads ({heads}) must be divisible by tensor parallel size ({tp}).'); use a TP that "
            f"divides {heads}."))
    requested = side.engine_kv_cache_dtype.lower()
    model_dtype = canonical_dtype(side.model.dtype)
    accepted = ASCEND_KV_CACHE_DTYPES if side.platform == "ascend" else VLLM_KV_CACHE_DTYPES
    if requested not in accepted:
        where = "vllm-ascend" if side.platform == "ascend" else "vLLM 0.34 (only vllm-ascend adds int8)"
        out.append(Finding(
            "KVCacheDTypeUnsupported", "error", side.model_field("kvCacheDtype"), "",
            f"{where} does not accept --kv-cache-dtype {side.kv_cache_dtype}; use one of "
            f"{', '.join(accepted)}."))
    elif requested in ("float16", "bfloat16") and model_dtype != requested:
        # vllm: `vllm/config/vllm.py` @ 0.34.0, VllmConfig._reject_mismatched_float_kv_cache.
        allowed = f"auto or {model_dtype}" if model_dtype in ("float16", "bfloat16") else "auto"
        out.append(Finding(
            "KVCacheDTypeIncompatible", "error", side.model_field("kvCacheDtype"), "",
            f"A {requested} KV cache with a {model_dtype} model is refused by vLLM at start-up "
            f"('kv_cache_dtype=\"{requested}\" is incompatible with dtype=\"{model_dtype}\"'); "
            f"set kvCacheDtype to {allowed}."))
    return out


def _side_rules(layout: SideLayout) -> list[Finding]:
    side = layout.side
    block = layout.engine_block_size
    out = []
    if block % side.kernel_block_size:
        # vllm-ascend: `vllm_ascend/worker/block_table.py` @ 0.30.0rc2 (worker start-up).
        out.append(Finding(
            "BlockSizeNotKernelAligned", "error", side.field("blockSize"), "",
            f"The {side.role} engine block size is {block} tokens, not a multiple of the "
            f"{side.kernel_block_size}-token kernel block; the worker would fail at start-up with "
            f"'None of the kernel sizes [{side.kernel_block_size}] can divide physical block size {block} "
            f"evenly'. Use a blockSize that is a multiple of {side.kernel_block_size}."))
    if side.platform == "ascend" and (side.block_size or c8_packed(side)):
        generic = vllm_block_size(side)
        if generic != block:
            lowered = side.block_size is not None and block < side.block_size
            cause = ("an int8/fp8 KV cache (C8 packs the MLA latent and caps the block at the one covering "
                     "the state page)") if c8_packed(side) else f"the requested blockSize {side.block_size}"
            out.append(Finding(
                "RequestedBlockLowered" if lowered else "AscendBlockRuleDiffers",
                "warning" if lowered else "info",
                side.field("blockSize") if side.block_size else side.model_field("kvCacheDtype"), "",
                f"On vllm-ascend the {side.role} engine block is {block} tokens"
                + (f", below the requested {side.block_size}" if lowered else "")
                + f"; plain vLLM's rule would give {generic}. vllm-ascend aligns pooled-indexer models "
                f"with its own rule, and {cause} is where the two differ. The operator renders {block}."))
    for group in side.model.groups:
        if isinstance(group, IndexerGroup) and block % group.compress_ratio:
            out.append(Finding(
                "BlockNotDivisibleByCompressRatio", "error", side.field("blockSize"), group.name,
                f"The {side.role} block of {block} tokens does not hold a whole number of "
                f"{group.compress_ratio}-token entries of its compressed indexer {group.name!r}; use a "
                f"blockSize that is a multiple of {group.compress_ratio}."))
    return out


def _pair_rules(p: SideLayout, d: SideLayout, connector: str, connector_path: str) -> list[Finding]:
    out = []
    p_block, d_block = p.engine_block_size, d.engine_block_size
    p_tp, d_tp = p.side.tensor_parallel, d.side.tensor_parallel
    segment = gcd(p_block, d_block)
    p_kernel, d_kernel = p.side.kernel_block_size, d.side.kernel_block_size
    if connector in V1_CONNECTORS and (p_block % d_kernel or d_block % p_kernel):
        # V1 expands both sides' logical blocks into kernel blocks of the local size (vllm-ascend:
        # `kv_p2p/mooncake_connector.py` @ 0.30.0rc2, `_get_group_kernel_params`).
        local, remote = (d_kernel, p_block) if p_block % d_kernel else (p_kernel, d_block)
        out.append(Finding(
            "CrossTPBlockSizesUnsupported", "error", connector_path, "",
            f"{connector} maps unequal logical blocks at kernel granularity, so each side's block must be a "
            f"multiple of the other side's kernel block; here it would fail mid-transfer with "
            f"'remote_block_size({remote}) not divisible by kernel_size({local})'. Use the same "
            "kernelBlockSize on both roles."))
    for group in p.side.model.groups:
        if isinstance(group, IndexerGroup) and group.compress_ratio > 1 and p_block != d_block \
                and segment % group.compress_ratio:
            out.append(Finding(
                "SegmentSplitsCompressedEntry", "error", d.side.field("blockSize"), group.name,
                f"Block sizes {p_block} (prefill) and {d_block} (decode) only share {segment}-token "
                f"segments, which split the {group.compress_ratio}-token entries of the compressed "
                f"indexer {group.name!r}; set blockSize on one role so the gcd is a multiple of "
                f"{group.compress_ratio}."))
    sharded = [g.name for g in (*p.token_groups, *d.token_groups) if not g.replicated]
    sharded += [g.name for g in p.state_groups]
    sharded = list(dict.fromkeys(sharded))
    if sharded and max(p_tp, d_tp) % min(p_tp, d_tp):
        out.append(Finding(
            "ShardedTPIncompatible", "error", d.side.field("tensorParallelSize"), sharded[0],
            f"Group {sharded[0]} is sharded by head, so one TP must divide the other, but prefill TP "
            f"is {p_tp} and decode TP is {d_tp}; choose a decode TP that divides or is a multiple "
            f"of {p_tp}."))
    elif p.state_groups and p_tp < d_tp and connector in V1_CONNECTORS:
        out.append(Finding(
            "ShardedTPIncompatible", "error", d.side.field("tensorParallelSize"), p.state_groups[0].name,
            f"{connector} only splits state from a larger prefill TP into a smaller decode TP "
            f"(prefill TP {p_tp}, decode TP {d_tp}); use MooncakeConnectorV2 or a decode TP <= {p_tp}."))
    for p_state in p.state_groups:
        d_state = d.group(p_state.name)
        assert isinstance(d_state, StateGroupLayout)
        if _per_head_shapes(p_state) != _per_head_shapes(d_state):
            out.append(Finding(
                "StateShapeMismatch", "error", d.side.field("numSpeculativeTokens"), p_state.name,
                f"The per-head state of group {p_state.name} differs between the roles (prefill "
                f"{p.side.num_speculative_tokens} speculative tokens, decode "
                f"{d.side.num_speculative_tokens}); the conv state is lengthened by speculative tokens, "
                "so use the same numSpeculativeTokens on both roles."))
    for p_tail in p.tail_groups:
        d_tail = d.group(p_tail.name)
        assert isinstance(d_tail, TailGroupLayout)
        if p_tail.used_bytes != d_tail.used_bytes:
            out.append(Finding(
                "StateShapeMismatch", "error", d.side.field("numSpeculativeTokens"), p_tail.name,
                f"The {p_tail.name} page holds the open indexer pool plus one row per speculative token, "
                f"so it differs between the roles (prefill {p.side.num_speculative_tokens} speculative "
                f"tokens, decode {d.side.num_speculative_tokens}); use the same numSpeculativeTokens on both "
                "roles."))
    out += _state_mode_rules(p, d, connector)
    if p_block != d_block and not out:
        out.append(Finding(
            "CrossTPSegments", "info", "", "",
            f"Prefill blocks of {p_block} tokens and decode blocks of {d_block} tokens are paired "
            f"through {segment}-token segments; replicated caches move as runs cut at both sides' "
            "block boundaries."))
    return out


def state_modes_must_match(connector: str, prefill: Side, decode: Side) -> bool:
    """Whether the two sides' state cache modes (prefix caching on a hybrid model) must be equal for the
    connector to find the request's state block: V1 with speculative tokens (V1_MIXED_STATE_ERRORS).
    MooncakeConnectorV2 takes the last prompt state block of either side's table, whatever its mode
    (vllm-ascend: `kv_p2p/mooncake/pull_worker.py` @ 0.30.0rc2, `_compute_group_block_ids`)."""
    return (connector in V1_CONNECTORS and prefill.model.is_hybrid
            and max(prefill.num_speculative_tokens, decode.num_speculative_tokens) > 0)


def _state_mode_rules(p: SideLayout, d: SideLayout, connector: str) -> list[Finding]:
    if p.mamba_cache_mode == d.mamba_cache_mode or not state_modes_must_match(connector, p.side, d.side):
        return []
    error = V1_MIXED_STATE_ERRORS[d.mamba_cache_mode]
    return [Finding(
        "PrefixCachingModeMismatch", "error", d.side.field("enablePrefixCaching"), p.state_groups[0].name,
        f"Prefix caching is {'on' if p.side.prefix_caching else 'off'} on prefill and "
        f"{'on' if d.side.prefix_caching else 'off'} on decode, so their state caches run in vLLM's "
        f"'{p.mamba_cache_mode}' and '{d.mamba_cache_mode}' modes; with {d.side.num_speculative_tokens} "
        f"speculative tokens {connector} cannot find the request's state block and fails mid-transfer "
        f"('{error}'). Set enablePrefixCaching the same on both roles, or use MooncakeConnectorV2.")]


def _per_head_shapes(layout: StateGroupLayout) -> list[tuple[int, ...]]:
    return [tuple(p.chunk_bytes for p in parts) for _, parts in layout.tensors]


def _run_size_rules(plan: TransferPlan, decode: Side) -> list[Finding]:
    out = []
    for group in plan.prefill.token_groups:
        mean = plan.mean_run_bytes(group.name)
        if 0 < mean < SMALL_RUN_BYTES:
            out.append(Finding(
                "SmallTransferRuns", "warning", decode.field("blockSize"), group.name,
                f"Group {group.name} moves in runs of {mean / 1024:.1f} KiB on average (for a prompt "
                f"of {plan.prompt_tokens} tokens); Mooncake tcp moves 4 KB runs ~15x slower than "
                "1 MB runs. Block sizes that are equal or multiples of each other give longer runs."))
    return out

"""Per-rank page geometry of every cache group of one side, for a given engine block size.

The layout is the one the serving image uses: one tensor per layer and cache component; within a
block, heads are outermost (HND: each head's tokens contiguous), K and V are separate tensors, MLA
and the indexer hold one replicated head; a state group occupies one padded slot per request,
holding its tensors back to back, each part-major then head-major.
"""

from __future__ import annotations

from dataclasses import dataclass

from pd_operator.kv.dtypes import canonical_dtype, dtype_bytes, is_fp8, resolve_cache_dtype
from pd_operator.kv.model import AttentionGroup, IndexerGroup, IndexerTailGroup, MLAGroup, StateGroup
from pd_operator.kv.side import Side

# vllm-ascend's C8 (int8/fp8) MLA page for pooled-indexer models stores the latent in 1-byte values, the
# rope part in bf16 and one fp32 scale per 128-value tile (vllm-ascend: `vllm_ascend/attention/utils.py`
# @ 0.30.0rc2, `get_sfa_qsfa_packed_head_dim`, SFA_QSFA_TILE_SIZE = 128): 512 + 0 + 16 = 528 B for GLM-Next.
C8_TILE = 128
C8_DTYPES = frozenset({"int8", "fp8"})


class LayoutError(ValueError):
    """A shape that cannot be laid out on this side (for example heads not divisible by TP)."""

    def __init__(self, code: str, group: str, message: str, field: str):
        super().__init__(message)
        self.code, self.group, self.field = code, group, field


@dataclass(frozen=True)
class HeadPart:
    """One concatenated part of a state tensor on one rank."""

    heads_total: int
    heads_local: int
    chunk_bytes: int
    """Bytes of one head's state."""
    offset: int
    """Byte offset of this part inside the request's state slot on this rank."""


@dataclass(frozen=True)
class TokenGroupLayout:
    """A token-paged cache group (attention, MLA, indexer) on one rank.

    Each component is its own tensor per layer, `[num_blocks, heads_local, entries_per_block,
    entry_bytes]`: dense attention has `k` and `v`, MLA has `nope` (latent) and `rope`, the indexer
    has `keys`. A component of zero bytes (NoPE MLA rope) is kept in the description but holds and
    moves nothing.
    """

    name: str
    kind: str
    num_layers: int
    heads_total: int
    heads_local: int
    components: tuple[tuple[str, int], ...]
    """(component name, bytes of one entry of one head)."""
    tokens_per_entry: int
    """1, or the compress ratio of a compressed indexer."""
    entries_per_block: int
    tp: int

    @property
    def replicated(self) -> bool:
        """MLA and the indexer always are; dense attention when there are fewer kv heads than ranks."""
        return self.kind != "attention" or self.heads_total < self.tp

    @property
    def entry_bytes(self) -> int:
        """Bytes of one entry of one head over all components."""
        return sum(width for _, width in self.components)

    def stride(self, component: str) -> int:
        """Bytes of one block of one component tensor on this rank."""
        width = dict(self.components)[component]
        return self.heads_local * self.entries_per_block * width

    @property
    def page_bytes(self) -> int:
        return self.heads_local * self.entries_per_block * self.entry_bytes

    @property
    def bytes_per_token(self) -> float:
        return self.heads_local * self.entry_bytes / self.tokens_per_entry

    def heads_of(self, tp_rank: int) -> range:
        """Global head indices held by a rank; kv heads fewer than TP are replicated."""
        if self.kind != "attention":
            return range(0, 1)
        if self.heads_total >= self.tp:
            per = self.heads_total // self.tp
            return range(tp_rank * per, tp_rank * per + per)
        first = tp_rank * self.heads_total // self.tp
        return range(first, first + 1)


@dataclass(frozen=True)
class TailGroupLayout:
    """A per-request page replicated on every rank (the indexer tail): moved whole from one prefill rank."""

    name: str
    num_layers: int
    used_bytes: int
    """Bytes of one layer's page for one request."""
    slot_bytes: int
    """The padded slot: the larger of this page and the indexer page (vllm-ascend's "small" page class)."""
    tp: int

    kind = "indexerTail"
    replicated = True

    @property
    def page_bytes(self) -> int:
        return self.slot_bytes


@dataclass(frozen=True)
class StateGroupLayout:
    name: str
    num_layers: int
    tensors: tuple[tuple[str, tuple[HeadPart, ...]], ...]
    state_bytes: int
    """Unpadded state bytes of one layer on one rank, per request."""
    slot_bytes: int
    """The padded slot (one main-class page)."""
    tp: int

    kind = "state"
    replicated = False

    @property
    def page_bytes(self) -> int:
        return self.slot_bytes


def _kv_dtype(group, side: Side) -> str:
    return resolve_cache_dtype(group.dtype, side.model.dtype) if group.dtype else side.cache_dtype


def pooled_indexer_ratio(side: Side) -> int | None:
    """The pool size of the model's compressed indexer (GLM-Next `index_kpool`), when it has one."""
    return next((g.compress_ratio for g in side.model.groups
                 if isinstance(g, IndexerGroup) and g.compress_ratio > 1), None)


def c8_packed(side: Side) -> bool:
    """vllm-ascend packs the MLA page of a pooled-indexer model when the KV cache is int8 or fp8
    (vllm-ascend: `vllm_ascend/patch/platform/patch_mamba_config.py` @ 0.30.0rc2, `_using_sparse_sfa_c8`)."""
    return (side.platform == "ascend" and canonical_dtype(side.cache_dtype) in C8_DTYPES
            and pooled_indexer_ratio(side) is not None)


def c8_entry_bytes(group: MLAGroup) -> int:
    return group.kv_lora_rank + group.qk_rope_head_dim * 2 + group.kv_lora_rank // C8_TILE * 4


def token_group_layout(group, side: Side, block: int) -> TokenGroupLayout:
    tp = side.tensor_parallel
    width = dtype_bytes(_kv_dtype(group, side))
    layers = group.layers(side.num_speculative_tokens)
    if isinstance(group, MLAGroup):
        if c8_packed(side) and not group.dtype:
            if group.kv_lora_rank % C8_TILE:
                raise LayoutError("C8LatentNotTileAligned", group.name,
                                  f"vllm-ascend packs an int8/fp8 MLA cache in {C8_TILE}-value tiles, "
                                  f"but the latent of group {group.name} has {group.kv_lora_rank} values; "
                                  "use kvCacheDtype auto for this model.", side.model_field("kvCacheDtype"))
            parts: tuple[tuple[str, int], ...] = (("packed", c8_entry_bytes(group)),)
        else:
            parts = (("nope", group.kv_lora_rank * width), ("rope", group.qk_rope_head_dim * width))
        return TokenGroupLayout(group.name, "mla", layers, 1, 1, parts, 1, block, tp)
    if isinstance(group, IndexerGroup):
        if is_fp8(_kv_dtype(group, side)):
            entry = group.head_dim + group.head_dim // group.quant_block_size * 4
        else:
            entry = group.head_dim * width
        return TokenGroupLayout(group.name, "indexer", layers, 1, 1, (("keys", entry),),
                                group.compress_ratio, block // group.compress_ratio, tp)
    assert isinstance(group, AttentionGroup)
    heads = group.num_kv_heads
    if heads >= tp and heads % tp:
        raise LayoutError("HeadsNotDivisibleByTP", group.name,
                          f"{heads} kv heads of group {group.name} cannot be split over TP {tp}; "
                          f"use a TP that divides {heads}.", side.field("tensorParallelSize"))
    if heads < tp and tp % heads:
        raise LayoutError("HeadsNotDivisibleByTP", group.name,
                          f"TP {tp} is not a multiple of the {heads} kv heads of group {group.name}, "
                          "so the heads cannot be replicated evenly; use a TP that divides or is a "
                          f"multiple of {heads}.", side.field("tensorParallelSize"))
    local = max(1, heads // tp)
    parts = (("k", group.head_size * width), ("v", group.head_size * width))
    return TokenGroupLayout(group.name, "attention", layers, heads, local, parts, 1, block, tp)


def tail_group_layout(group: IndexerTailGroup, side: Side, small_page: int) -> TailGroupLayout:
    used = group.bytes_per_request(side.num_speculative_tokens)
    return TailGroupLayout(group.name, group.layers(side.num_speculative_tokens), used,
                           max(used, small_page), side.tensor_parallel)


def state_bytes_per_rank(group: StateGroup, side: Side) -> int:
    return sum(p.chunk_bytes * p.heads_local for _, parts in _state_parts(group, side) for p in parts)


def _state_parts(group: StateGroup, side: Side) -> list[tuple[str, tuple[HeadPart, ...]]]:
    tp = side.tensor_parallel
    out = []
    offset = 0
    for tensor in group.tensors:
        chunk = tensor.elements_per_head(side.num_speculative_tokens) * dtype_bytes(tensor.dtype)
        parts = []
        for heads in tensor.head_groups:
            if heads % tp:
                raise LayoutError("HeadsNotDivisibleByTP", group.name,
                                  f"state tensor {tensor.name} of group {group.name} has {heads} heads, "
                                  f"which TP {tp} does not divide; state is sharded by head, so use a "
                                  f"TP that divides {heads}.", side.field("tensorParallelSize"))
            parts.append(HeadPart(heads, heads // tp, chunk, offset))
            offset += chunk * (heads // tp)
        out.append((tensor.name, tuple(parts)))
    return out


def state_group_layout(group: StateGroup, side: Side, slot_bytes: int) -> StateGroupLayout:
    tensors = tuple(_state_parts(group, side))
    used = sum(p.chunk_bytes * p.heads_local for _, parts in tensors for p in parts)
    return StateGroupLayout(group.name, group.layers(side.num_speculative_tokens), tensors, used,
                            max(slot_bytes, used),
                            side.tensor_parallel)

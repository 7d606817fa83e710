"""The engine block size of one side: vLLM's hybrid page-size unification, and vllm-ascend's variant.

vLLM gives every cache group the same page size. For hybrid models the attention block grows until
one attention page can hold one state page (vllm: `vllm/platforms/interface.py` @ 0.34.0,
`Platform.update_block_size_for_backend` and `_align_hybrid_block_size`). Since the state page scales
with heads/TP, the block size depends on TP.

vllm-ascend replaces the rule for models with a pooled (compressed) sparse indexer such as GLM-Next
(vllm-ascend: `vllm_ascend/patch/platform/patch_mamba_config.py` @ 0.30.0rc2, the `index_kpool`
branch of the patched `HybridAttentionMambaModelConfig.verify_and_update_config`, and
`vllm_ascend/platform.py` `NPUPlatform._align_hybrid_block_size`): the block is aligned to
`lcm(128, index_kpool * 16)` tokens, so the pooled indexer page is a whole number of 16-entry
kernel rows; an int8/fp8 ("C8") KV cache packs the MLA latent at 1 byte per value plus fp32
tile scales, and the C8 block is the smallest aligned block covering the state page, whatever
block was requested. vLLM's generic rule then runs on the result and keeps it. The operator
always renders `--block-size` (the engine block it planned), so pods take the path of a
user-specified block; the rule here is that path.

Prefix caching (`--enable-prefix-caching`) switches a hybrid model's state cache to vLLM's "align" mode
(vllm: `vllm/model_executor/models/config.py` @ 0.34.0, `MambaModelConfig.verify_and_update_config`;
vllm-ascend keeps it in its patched hook). The generic rule then also rounds its alignment to the lcm with
the state layers' prefill checkpoint alignment; the pooled-indexer rule does not. Both then tie the state
block to the engine block (`mamba_block_size = block_size`, not `max_model_len`): a running request holds one
more state block per layer (the state it reads and the one it writes), prefix hits land on engine block
boundaries, and the request's final state sits in the block of its last prompt token, which the connector
picks by position on either side, so the transfer moves the same bytes (kv/compat.py names the pairing
where it does not).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, lcm

from pd_operator.kv.model import IndexerTailGroup, StateGroup
from pd_operator.kv.pages import (
    StateGroupLayout,
    TailGroupLayout,
    TokenGroupLayout,
    c8_packed,
    pooled_indexer_ratio,
    state_bytes_per_rank,
    state_group_layout,
    tail_group_layout,
    token_group_layout,
)
from pd_operator.kv.side import Side

# MLA backends need at least 128-token alignment whatever the kernel says (vLLM, `_align_hybrid_block_size`).
MLA_MIN_ALIGN = 128
# Without --block-size vLLM's phase 1 takes CacheConfig.DEFAULT_BLOCK_SIZE when the backend accepts it,
# else the backend's smallest kernel block (vllm: `vllm/config/cache.py` and
# `AttentionBackend.get_preferred_block_size` @ 0.34.0).
VLLM_DEFAULT_BLOCK = 64
# vllm-ascend's pooled-indexer rule: the scheduler block stays a multiple of the 128-token C128 kernel
# block and block / index_kpool a multiple of the indexer kernel's 16 rows (patch_mamba_config.py).
ASCEND_C128 = 128
ASCEND_INDEXER_ROWS = 16
# Align mode's extra factor: the lcm of the state layers' prefill checkpoint alignments, or 1 unless every
# state layer exports mid-prefill checkpoints (vllm: `vllm/model_executor/layers/mamba/abstract.py` @ 0.34.0,
# `get_mamba_prefill_checkpoint_alignment`). Only vLLM's GDN layer with FlashInfer's prefill kernel, which
# runs on CUDA alone, declares one (64, `qwen_gdn_linear_attn.py`); KDA layers and vllm-ascend 0.30.0rc2's
# layers never do. So on the platforms the operator plans for it is 1, and align mode keeps the engine block.
PREFILL_CHECKPOINT_ALIGNMENT = 1


@dataclass(frozen=True)
class SideLayout:
    side: Side
    engine_block_size: int
    attn_bytes_per_token: int
    """Bytes of one token of the main (attention-like) page on one rank."""
    state_page_bytes: int
    """Largest unpadded per-layer state on one rank (0 for models without state)."""
    reason: str
    """One sentence on how the block size came about."""
    token_groups: tuple[TokenGroupLayout, ...]
    state_groups: tuple[StateGroupLayout, ...]
    tail_groups: tuple[TailGroupLayout, ...] = ()

    @property
    def main_page_bytes(self) -> int:
        return self.engine_block_size * self.attn_bytes_per_token

    @property
    def groups(self) -> tuple[TokenGroupLayout | StateGroupLayout | TailGroupLayout, ...]:
        return (*self.token_groups, *self.tail_groups, *self.state_groups)

    def group(self, name: str) -> TokenGroupLayout | StateGroupLayout | TailGroupLayout:
        return next(g for g in self.groups if g.name == name)

    @property
    def mamba_cache_mode(self) -> str:
        """vLLM's `mamba_cache_mode`: "align" when a side with state caches prefixes, else "none"."""
        return "align" if self.side.prefix_caching and self.state_groups else "none"

    @property
    def state_block_size(self) -> int | None:
        """Tokens one state block stands for (vLLM's `mamba_block_size`): the engine block in align mode;
        None in "none" mode, where one state block holds the whole request (max_model_len)."""
        return self.engine_block_size if self.mamba_cache_mode == "align" else None

    @property
    def state_slots_per_request(self) -> int:
        """State blocks a running request holds per state layer (vllm: `MambaSpec.max_memory_usage_bytes`
        @ 0.34.0): the one it reads and the one it writes in align mode, one in "none" mode, plus one per
        speculative token."""
        if not self.state_groups:
            return 0
        return (2 if self.mamba_cache_mode == "align" else 1) + self.side.num_speculative_tokens

    @property
    def state_bytes_per_request(self) -> int:
        """Bytes of state slots a running request holds on one rank, over every state layer."""
        return self.state_slots_per_request * sum(g.slot_bytes * g.num_layers for g in self.state_groups)

    @property
    def token_bytes_per_block(self) -> int:
        """Bytes one engine block of tokens takes on one rank, over every token-paged layer: what one
        cached prefix block holds."""
        return sum(g.page_bytes * g.num_layers for g in self.token_groups)

    @property
    def prefix_hit_tokens(self) -> int | None:
        """Token boundaries prefix-cache hits land on (vLLM's `cache_hit_alignment_tokens`) when the side
        caches prefixes, else None. Every prefix-cacheable group pages in the engine block (state blocks
        too, in align mode), so hashes and hits are whole engine blocks (vllm: `vllm/v1/core/
        kv_cache_utils.py` @ 0.34.0, `resolve_kv_cache_block_sizes`, `resolve_cache_hit_alignment_tokens`)."""
        return self.engine_block_size if self.side.prefix_caching else None


def phase1_block(side: Side) -> int:
    """The block vLLM starts from: the requested one, else its default where the kernel accepts it."""
    if side.block_size:
        return side.block_size
    kernel = side.kernel_block_size
    return VLLM_DEFAULT_BLOCK if VLLM_DEFAULT_BLOCK % kernel == 0 else kernel


def vllm_hybrid_block(side: Side, start: int, attn_1tok: int, state_page: int) -> int:
    """vLLM's `_align_hybrid_block_size` from a starting block (phase 1's or the requested one)."""
    kernel = side.kernel_block_size
    align = max(kernel, start)
    if any(g.kind == "mla" for g in side.model.groups):
        align = max(align, MLA_MIN_ALIGN)
    if side.prefix_caching:  # align mode: prefill checkpoints land on block boundaries
        align = lcm(align, PREFILL_CHECKPOINT_ALIGNMENT)
    block = align * ceil(state_page / (align * attn_1tok))
    block = ceil(block / kernel) * kernel
    return max(start, block)


def ascend_pooled_block(side: Side, kpool: int, attn_1tok: int, state_page: int) -> int:
    """vllm-ascend's pooled-indexer rule (patch_mamba_config.py @ 0.30.0rc2)."""
    align = lcm(ASCEND_C128, kpool * ASCEND_INDEXER_ROWS)
    needed = ceil(state_page / attn_1tok)
    block = align * ceil(max(side.block_size or ASCEND_C128, needed) / align)
    if c8_packed(side):  # the C8 block covers the state page and no more, even when more was requested
        block = min(block, align * ceil(needed / align))
    return block


def unified_block_size(side: Side, attn_1tok: int, state_page: int) -> tuple[int, str]:
    start = phase1_block(side)
    if state_page == 0:
        why = "the requested --block-size" if side.block_size else f"vLLM's starting block ({start})"
        return start, f"No state cache: the engine block is {why}."
    kpool = pooled_indexer_ratio(side)
    needed = ceil(state_page / attn_1tok)
    if side.platform == "ascend" and kpool is not None:
        align = lcm(ASCEND_C128, kpool * ASCEND_INDEXER_ROWS)
        block = ascend_pooled_block(side, kpool, attn_1tok, state_page)
        if not c8_packed(side):
            block = vllm_hybrid_block(side, block, attn_1tok, state_page)
        return block, (
            f"vllm-ascend's pooled-indexer rule at TP {side.tensor_parallel}: a {state_page}-byte state page "
            f"needs {needed} tokens of {attn_1tok} bytes, rounded up to a multiple of "
            f"lcm({ASCEND_C128}, {kpool}x{ASCEND_INDEXER_ROWS}) = {align} tokens.")
    block = vllm_hybrid_block(side, start, attn_1tok, state_page)
    return block, (
        f"Hybrid unification at TP {side.tensor_parallel}: a {state_page}-byte state page needs "
        f"{needed} tokens of {attn_1tok} bytes, rounded up to a multiple of "
        f"{max(side.kernel_block_size, start)} tokens.")


def side_layout(side: Side) -> SideLayout:
    """Raises pages.LayoutError when a shape cannot be sharded at this TP."""
    token_groups0 = [token_group_layout(g, side, side.kernel_block_size)
                     for g in side.model.groups if g.kind not in ("state", "indexerTail")]
    attn_1tok = max(int(g.bytes_per_token) for g in token_groups0 if g.kind in ("mla", "attention"))
    states = [g for g in side.model.groups if isinstance(g, StateGroup)]
    state_page = max((state_bytes_per_rank(g, side) for g in states), default=0)
    block, reason = unified_block_size(side, attn_1tok, state_page)
    token_groups = tuple(token_group_layout(g, side, block) for g in side.model.groups
                         if g.kind not in ("state", "indexerTail"))
    # vllm-ascend pads the indexer tail to its "small" page class, the pooled indexer page
    # (vllm-ascend: `vllm_ascend/models/glm5next/cache_config.py`, `_align_glm5_next_cache_specs`).
    small_page = max((g.page_bytes for g in token_groups if g.kind == "indexer"), default=0)
    tails = tuple(tail_group_layout(g, side, small_page) for g in side.model.groups
                  if isinstance(g, IndexerTailGroup))
    state_groups = tuple(state_group_layout(g, side, block * attn_1tok) for g in states)
    return SideLayout(side, block, attn_1tok, state_page, reason, token_groups, state_groups, tails)


def vllm_block_size(side: Side) -> int:
    """The engine block plain vLLM's rule gives the same side (what vllm-ascend's differs from)."""
    return side_layout(replace(side, platform="vllm")).engine_block_size

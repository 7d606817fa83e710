"""The engine block size of one side: vLLM's hybrid page-size unification.

vLLM gives every cache group the same page size. For hybrid models the attention block grows until
one attention page can hold one state page (vllm: `vllm/platforms/interface.py`,
`Platform._align_hybrid_block_size`; vllm-ascend patches the same rule in
`vllm_ascend/patch/platform/patch_mamba_config.py`). Since the state page scales with heads/TP,
the block size depends on TP.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, lcm

from pd_operator.kv.model import StateGroup
from pd_operator.kv.pages import (
    StateGroupLayout,
    TokenGroupLayout,
    state_bytes_per_rank,
    state_group_layout,
    token_group_layout,
)
from pd_operator.kv.side import Side

# MLA backends need at least 128-token alignment whatever the kernel says (vLLM, same function).
MLA_MIN_ALIGN = 128


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

    @property
    def main_page_bytes(self) -> int:
        return self.engine_block_size * self.attn_bytes_per_token

    @property
    def groups(self) -> tuple[TokenGroupLayout | StateGroupLayout, ...]:
        return (*self.token_groups, *self.state_groups)

    def group(self, name: str) -> TokenGroupLayout | StateGroupLayout:
        return next(g for g in self.groups if g.name == name)


def unified_block_size(side: Side, attn_1tok: int, state_page: int) -> tuple[int, str]:
    kernel = side.kernel_block_size
    requested = side.block_size
    if state_page == 0:
        block = requested or kernel
        why = "the requested --block-size" if requested else f"the backend kernel block ({kernel})"
        return block, f"No state cache: the engine block is {why}."
    align = max(kernel, requested or 0)
    if any(g.kind == "mla" for g in side.model.groups):
        align = max(align, MLA_MIN_ALIGN)
    block = align * ceil(state_page / (align * attn_1tok))
    block = ceil(block / lcm(kernel)) * lcm(kernel)
    return block, (
        f"Hybrid unification at TP {side.tensor_parallel}: a {state_page}-byte state page needs "
        f"{ceil(state_page / attn_1tok)} tokens of {attn_1tok} bytes, rounded up to a multiple of "
        f"{align} tokens."
    )


def side_layout(side: Side) -> SideLayout:
    """Raises pages.LayoutError when a shape cannot be sharded at this TP."""
    token_groups0 = [token_group_layout(g, side, side.kernel_block_size)
                     for g in side.model.groups if g.kind != "state"]
    attn_1tok = max(int(g.bytes_per_token) for g in token_groups0 if g.kind in ("mla", "attention"))
    states = [g for g in side.model.groups if isinstance(g, StateGroup)]
    state_page = max((state_bytes_per_rank(g, side) for g in states), default=0)
    block, reason = unified_block_size(side, attn_1tok, state_page)
    token_groups = tuple(token_group_layout(g, side, block) for g in side.model.groups if g.kind != "state")
    state_groups = tuple(state_group_layout(g, side, block * attn_1tok) for g in states)
    return SideLayout(side, block, attn_1tok, state_page, reason, token_groups, state_groups)

"""Paged KV buffers filled with known content, and a reference executor for transfer plans.

A prompt's cache content is a function of what it is (group, component, layer, global head, entry,
byte) and not of where it is stored, so a TP8 prefill and a TP4 decode hold the same bytes in
different places. `write_prompt` puts that content where one rank's layout keeps it, using numpy
reshapes of the region (independent of the plan's offset arithmetic). A plan is exact when
applying it to the prefill buffers leaves each decode buffer equal to what `write_prompt` gives for
decode, every needed byte written once and no other byte touched.

The Mooncake tests fill real registered memory with the same functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from math import ceil

import numpy as np

from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.pages import StateGroupLayout, TailGroupLayout, TokenGroupLayout
from pd_operator.kv.transfer_plan import TransferPlan, pp_stage

RegionKey = tuple[str, str, int]
"""(group, component, group-local layer); state groups use the component `state`, tails `tail`."""

# What unwritten decode memory holds, and what prefill holds where no prompt content lives.
UNWRITTEN = 0xEE


@dataclass(frozen=True)
class Region:
    key: RegionKey
    nbytes: int


def rank_layers(layout: SideLayout, num_layers: int, rank: int) -> range:
    """The group-local layers a (stage * tp + tp_rank) rank holds."""
    pp = layout.side.pipeline_parallel
    stage = rank // layout.side.tensor_parallel
    layers = [i for i in range(num_layers) if pp_stage(i, num_layers, pp) == stage]
    return range(layers[0], layers[-1] + 1) if layers else range(0)


def regions(layout: SideLayout, rank: int, num_blocks: int, num_slots: int) -> Iterator[Region]:
    """Every non-empty per-layer tensor of one rank, for a pool of num_blocks blocks and num_slots slots."""
    for g in layout.token_groups:
        for component, width in g.components:
            if width == 0:
                continue
            for layer in rank_layers(layout, g.num_layers, rank):
                yield Region((g.name, component, layer), num_blocks * g.stride(component))
    for t in layout.tail_groups:
        for layer in rank_layers(layout, t.num_layers, rank):
            yield Region((t.name, "tail", layer), num_slots * t.slot_bytes)
    for s in layout.state_groups:
        for layer in rank_layers(layout, s.num_layers, rank):
            yield Region((s.name, "state", layer), num_slots * s.slot_bytes)


def allocate(layout: SideLayout, rank: int, num_blocks: int, num_slots: int,
             fill: int = UNWRITTEN) -> dict[RegionKey, np.ndarray]:
    return {r.key: np.full(r.nbytes, fill, dtype=np.uint8)
            for r in regions(layout, rank, num_blocks, num_slots)}


def content(seed: tuple[int, ...], positions: np.ndarray) -> np.ndarray:
    """Deterministic bytes for an (identity, position) pair: a splitmix-style hash, low byte."""
    x = 0
    for value in seed:
        x = ((x * 0x100000001B3) ^ (value + 1)) & 0xFFFFFFFFFFFFFFFF
    with np.errstate(over="ignore"):
        z = positions.astype(np.uint64) + np.uint64((x * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z & np.uint64(0xFF)).astype(np.uint8)


def _name_id(name: str) -> int:
    return int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little") % (1 << 31)


def write_prompt(layout: SideLayout, rank: int, buffers: dict[RegionKey, np.ndarray],
                 blocks: np.ndarray, slot: int, prompt_tokens: int) -> None:
    """Write the prompt's cache content into one rank's buffers, where that rank's layout keeps it."""
    tp_rank = rank % layout.side.tensor_parallel
    for g in layout.token_groups:
        _write_tokens(g, tp_rank, buffers, blocks, prompt_tokens)
    for t in layout.tail_groups:
        _write_tail(t, buffers, slot)
    for s in layout.state_groups:
        _write_state(s, tp_rank, buffers, slot)


def _write_tokens(g: TokenGroupLayout, tp_rank: int, buffers: dict[RegionKey, np.ndarray],
                  blocks: np.ndarray, prompt_tokens: int) -> None:
    entries = ceil(prompt_tokens / g.tokens_per_entry)
    e = np.arange(entries)
    heads = g.heads_of(tp_rank)
    for component, width in g.components:
        for (group, comp, layer), buf in buffers.items():
            if group != g.name or comp != component:
                continue
            view = buf.reshape(-1, g.heads_local, g.entries_per_block, width)
            for local, head in enumerate(heads):
                seed = (_name_id(g.name), _name_id(component), layer, head)
                positions = (e[:, None] * width + np.arange(width)[None, :]).ravel()
                values = content(seed, positions).reshape(entries, width)
                view[blocks[e // g.entries_per_block], local, e % g.entries_per_block, :] = values


def _write_tail(t: TailGroupLayout, buffers: dict[RegionKey, np.ndarray], slot: int) -> None:
    """The same bytes on every rank: the tail is replicated."""
    for (group, _, layer), buf in buffers.items():
        if group == t.name:
            buf.reshape(-1, t.slot_bytes)[slot, :t.used_bytes] = content((_name_id(t.name), layer),
                                                                          np.arange(t.used_bytes))


def _write_state(s: StateGroupLayout, tp_rank: int, buffers: dict[RegionKey, np.ndarray], slot: int) -> None:
    for (group, _, layer), buf in buffers.items():
        if group != s.name:
            continue
        slot_view = buf.reshape(-1, s.slot_bytes)[slot]
        for tensor_index, (_, parts) in enumerate(s.tensors):
            for part_index, part in enumerate(parts):
                area = slot_view[part.offset: part.offset + part.heads_local * part.chunk_bytes]
                area = area.reshape(part.heads_local, part.chunk_bytes)
                for local in range(part.heads_local):
                    head = tp_rank * part.heads_local + local
                    seed = (_name_id(s.name), tensor_index, part_index, layer, head)
                    area[local] = content(seed, np.arange(part.chunk_bytes))


def apply_plan(plan: TransferPlan, prefill: dict[int, dict[RegionKey, np.ndarray]],
               decode: dict[int, dict[RegionKey, np.ndarray]]) -> dict[int, dict[RegionKey, np.ndarray]]:
    """Copy every run; returns per decode rank and region how many times each byte was written."""
    writes = {rank: {k: np.zeros(len(v), dtype=np.uint16) for k, v in bufs.items()}
              for rank, bufs in decode.items()}
    for rs in plan.runsets:
        for layer in rs.layers:
            key = (rs.group, rs.component, layer)
            src_buf = prefill[rs.prefill_rank][key]
            dst_buf = decode[rs.decode_rank][key]
            count = writes[rs.decode_rank][key]
            for s, d, n in zip(rs.src.tolist(), rs.dst.tolist(), rs.length.tolist(), strict=True):
                if s < 0 or d < 0 or s + n > len(src_buf) or d + n > len(dst_buf):
                    raise IndexError(f"run {rs.group}/{rs.component} layer {layer} "
                                     f"src={s} dst={d} len={n} is out of bounds")
                dst_buf[d: d + n] = src_buf[s: s + n]
                count[d: d + n] += 1
    return writes


def pool_sizes(plan: TransferPlan) -> tuple[tuple[int, int], tuple[int, int]]:
    """(num_blocks, num_slots) each side's pool needs to hold the plan's block ids and slot."""
    return ((int(plan.prefill_blocks.max()) + 1, plan.prefill_slot + 1),
            (int(plan.decode_blocks.max()) + 1, plan.decode_slot + 1))


def run_reference(plan: TransferPlan) -> tuple[bool, str]:
    """Execute a plan in memory; (exact, first problem) for every decode rank of one DP engine."""
    (p_blocks, p_slots), (d_blocks, d_slots) = pool_sizes(plan)
    p_layout, d_layout = plan.prefill, plan.decode
    p_ranks = p_layout.side.tensor_parallel * p_layout.side.pipeline_parallel
    prefill = {}
    for rank in range(p_ranks):
        # Prefill memory outside the prompt holds other requests' data: anything but our content.
        bufs = allocate(p_layout, rank, p_blocks, p_slots, fill=0x5A)
        write_prompt(p_layout, rank, bufs, plan.prefill_blocks, plan.prefill_slot, plan.prompt_tokens)
        prefill[rank] = bufs
    decode, expected = {}, {}
    for rank in range(d_layout.side.tensor_parallel):
        decode[rank] = allocate(d_layout, rank, d_blocks, d_slots)
        expected[rank] = allocate(d_layout, rank, d_blocks, d_slots)
        write_prompt(d_layout, rank, expected[rank], plan.decode_blocks, plan.decode_slot,
                     plan.prompt_tokens)
    needed = {rank: needed_mask(d_layout, rank, d_blocks, d_slots, plan) for rank in decode}
    try:
        writes = apply_plan(plan, prefill, decode)
    except IndexError as err:
        return False, str(err)
    for rank in decode:
        for key, buf in decode[rank].items():
            if not np.array_equal(buf, expected[rank][key]):
                first = int(np.flatnonzero(buf != expected[rank][key])[0])
                return False, f"decode rank {rank} {key}: byte {first} differs"
            if not np.array_equal(writes[rank][key], needed[rank][key].astype(np.uint16)):
                first = int(np.flatnonzero(writes[rank][key] != needed[rank][key])[0])
                return False, (f"decode rank {rank} {key}: byte {first} written "
                               f"{int(writes[rank][key][first])} times")
    return True, ""


def needed_mask(layout: SideLayout, rank: int, num_blocks: int, num_slots: int,
                plan: TransferPlan) -> dict[RegionKey, np.ndarray]:
    """Which bytes of a decode rank hold prompt content (found by writing twice with different fills)."""
    a = allocate(layout, rank, num_blocks, num_slots, fill=0x00)
    b = allocate(layout, rank, num_blocks, num_slots, fill=0xFF)
    write_prompt(layout, rank, a, plan.decode_blocks, plan.decode_slot, plan.prompt_tokens)
    write_prompt(layout, rank, b, plan.decode_blocks, plan.decode_slot, plan.prompt_tokens)
    # A content byte is equal in both; a background byte differs (0x00 vs 0xFF).
    return {k: a[k] == b[k] for k in a}

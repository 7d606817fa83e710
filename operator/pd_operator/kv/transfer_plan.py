"""The transfer plan: which bytes every decode rank pulls from which prefill rank for one request.

Replicated caches (MLA, indexer, replicated kv heads) are held whole by several prefill ranks; the
decode rank's pulls are spread over them. Because the two sides may use different engine block
sizes, token-paged caches are cut into runs at every block boundary of either side: a run never
crosses a block on either side, and between two such cuts it is contiguous on both (the naive plan
cuts at every multiple of gcd(P_block, D_block) instead, as the seed connector's
`_compute_cross_tp_runs` does before coalescing). Sharded caches (dense kv heads, state heads)
come from the prefill rank that holds each head; when one prefill rank holds several of a decode
rank's heads their runs merge where both sides are contiguous.

Offsets are bytes within the per-layer tensor of one (group, component) on one rank, so one
`RunSet` serves every layer it lists. Block ids default to a synthetic table in which no two blocks
are adjacent (`1, 3, 5, ...`), the worst case for merging, which is what the entry counts assume.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from math import ceil, gcd

import numpy as np

from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.pages import StateGroupLayout, TailGroupLayout, TokenGroupLayout

# The state slot of the request on both sides, unless the caller says otherwise.
DEFAULT_STATE_SLOT = 1


class PlanError(ValueError):
    """The pairing cannot be planned (the compatibility check names why)."""


@dataclass(frozen=True, eq=False)
class RunSet:
    group: str
    kind: str
    component: str
    decode_rank: int
    """TP rank within the decode DP engine serving the request."""
    prefill_rank: int
    """`pp_stage * prefill_tp + tp_rank` within the prefill DP engine that computed the prompt."""
    layers: tuple[int, ...]
    """Group-local layer indices the offsets apply to."""
    src: np.ndarray
    dst: np.ndarray
    length: np.ndarray

    @property
    def entries(self) -> int:
        return len(self.length) * len(self.layers)

    @property
    def bytes(self) -> int:
        return int(self.length.sum()) * len(self.layers)


@dataclass(frozen=True, eq=False)
class TransferPlan:
    prefill: SideLayout
    decode: SideLayout
    prompt_tokens: int
    segment_tokens: int
    merged: bool
    prefill_blocks: np.ndarray
    decode_blocks: np.ndarray
    prefill_slot: int
    decode_slot: int
    runsets: tuple[RunSet, ...] = field(repr=False)

    @property
    def entries(self) -> int:
        return sum(r.entries for r in self.runsets)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.runsets)

    def per_prefill_rank(self) -> list[dict]:
        """Bytes each prefill rank (`pp_stage * tp + tp_rank`) sends for one request, per cache group."""
        ranks: dict[int, dict] = {}
        for r in self.runsets:
            row = ranks.setdefault(r.prefill_rank, {"rank": r.prefill_rank, "bytes": 0, "groups": {}})
            row["bytes"] += r.bytes
            row["groups"][r.group] = row["groups"].get(r.group, 0) + r.bytes
        return [ranks[rank] for rank in sorted(ranks)]

    def per_decode_rank(self) -> list[dict]:
        ranks: dict[int, dict] = {}
        for r in self.runsets:
            row = ranks.setdefault(r.decode_rank, {"rank": r.decode_rank, "entries": 0, "bytes": 0,
                                                   "groups": {}})
            row["entries"] += r.entries
            row["bytes"] += r.bytes
            grp = row["groups"].setdefault(r.group, {"prefillRanks": set(), "entries": 0, "bytes": 0})
            grp["prefillRanks"].add(r.prefill_rank)
            grp["entries"] += r.entries
            grp["bytes"] += r.bytes
        out = []
        for rank in sorted(ranks):
            row = ranks[rank]
            for grp in row["groups"].values():
                grp["prefillRanks"] = sorted(grp["prefillRanks"])
            out.append(row)
        return out

    def mean_run_bytes(self, group: str) -> float:
        sets = [r for r in self.runsets if r.group == group]
        count = sum(r.entries for r in sets)
        return sum(r.bytes for r in sets) / count if count else 0.0


def synthetic_blocks(count: int) -> np.ndarray:
    """Block ids with a gap between any two, so no run can merge across blocks."""
    return 1 + 2 * np.arange(count, dtype=np.int64)


def blocks_needed(layout: SideLayout, prompt_tokens: int) -> int:
    return ceil(prompt_tokens / layout.engine_block_size)


def pp_stage(layer: int, num_layers: int, pp: int) -> int:
    """Pipeline stage of a group-local layer: layers split into pp contiguous, even stages."""
    return layer * pp // num_layers


def plan_transfer(prefill: SideLayout, decode: SideLayout, prompt_tokens: int, *,
                  prefill_blocks: np.ndarray | None = None, decode_blocks: np.ndarray | None = None,
                  prefill_slot: int = DEFAULT_STATE_SLOT, decode_slot: int = DEFAULT_STATE_SLOT,
                  merge: bool = True) -> TransferPlan:
    if prompt_tokens < 1:
        raise PlanError("the prompt must have at least one token")
    p_blocks = synthetic_blocks(blocks_needed(prefill, prompt_tokens)) if prefill_blocks is None \
        else np.asarray(prefill_blocks, dtype=np.int64)
    d_blocks = synthetic_blocks(blocks_needed(decode, prompt_tokens)) if decode_blocks is None \
        else np.asarray(decode_blocks, dtype=np.int64)
    for name, blocks, layout in (("prefill", p_blocks, prefill), ("decode", d_blocks, decode)):
        if len(blocks) < blocks_needed(layout, prompt_tokens):
            raise PlanError(f"the {name} block table has {len(blocks)} blocks; "
                            f"{blocks_needed(layout, prompt_tokens)} are needed")
    segment = gcd(prefill.engine_block_size, decode.engine_block_size)
    runsets: list[RunSet] = []
    for index, p_group in enumerate(prefill.token_groups):
        d_group = decode.group(p_group.name)
        assert isinstance(d_group, TokenGroupLayout)
        runsets += _token_runs(index, p_group, d_group, prefill, prompt_tokens, p_blocks, d_blocks,
                               segment, merge)
    for index, p_tail in enumerate(prefill.tail_groups, start=len(prefill.token_groups)):
        d_tail = decode.group(p_tail.name)
        assert isinstance(d_tail, TailGroupLayout)
        runsets += _tail_runs(index, p_tail, d_tail, prefill, prefill_slot, decode_slot)
    for p_state in prefill.state_groups:
        d_state = decode.group(p_state.name)
        assert isinstance(d_state, StateGroupLayout)
        runsets += _state_runs(p_state, d_state, prefill, prefill_slot, decode_slot, merge)
    return TransferPlan(prefill, decode, prompt_tokens, segment, merge, p_blocks, d_blocks,
                        prefill_slot, decode_slot, tuple(runsets))


def _stage_layers(num_layers: int, pp: int) -> dict[int, tuple[int, ...]]:
    stages: dict[int, list[int]] = defaultdict(list)
    for layer in range(num_layers):
        stages[pp_stage(layer, num_layers, pp)].append(layer)
    return {stage: tuple(layers) for stage, layers in stages.items()}


def _cuts(entries: int, p_per_block: int, d_per_block: int, step: int, merge: bool) -> np.ndarray:
    if merge:
        points = np.union1d(np.arange(0, entries, p_per_block), np.arange(0, entries, d_per_block))
    else:
        points = np.arange(0, entries, step)
    return np.append(points, entries).astype(np.int64)


def _token_runs(index: int, p: TokenGroupLayout, d: TokenGroupLayout, prefill: SideLayout,
                prompt_tokens: int, p_blocks: np.ndarray, d_blocks: np.ndarray, segment: int,
                merge: bool) -> list[RunSet]:
    ratio = p.tokens_per_entry
    if segment % ratio:
        raise PlanError(f"{segment}-token segments split the {ratio}-token entries of group {p.name}")
    entries = ceil(prompt_tokens / ratio)
    cuts = _cuts(entries, p.entries_per_block, d.entries_per_block, segment // ratio, merge)
    starts, lengths = cuts[:-1], np.diff(cuts)
    p_tp, d_tp = p.tp, d.tp
    holders: dict[int, list[int]] = defaultdict(list)
    for rank in range(p_tp):
        for head in p.heads_of(rank):
            holders[head].append(rank)
    stages = _stage_layers(p.num_layers, prefill.side.pipeline_parallel)
    out = []
    for component, width in p.components:
        if width == 0:  # NoPE rope: a zero-size component holds nothing and is never moved
            continue
        for d_rank in range(d_tp):
            pieces: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = defaultdict(list)
            d_heads = d.heads_of(d_rank)
            for head in d_heads:
                choices = holders[head]
                p_rank = choices[(d_rank + index * d_tp) % len(choices)]
                p_local = head - p.heads_of(p_rank).start
                d_local = head - d_heads.start
                src = _offsets(starts, p_blocks, p.entries_per_block, p.stride(component), p_local, width)
                dst = _offsets(starts, d_blocks, d.entries_per_block, d.stride(component), d_local, width)
                pieces[p_rank].append((src, dst, lengths * width))
            for p_rank, parts in pieces.items():
                src, dst, length = _merge(parts, merge)
                for stage, layers in stages.items():
                    out.append(RunSet(p.name, p.kind, component, d_rank, stage * p_tp + p_rank, layers,
                                      src, dst, length))
    return out


def _offsets(starts: np.ndarray, blocks: np.ndarray, per_block: int, stride: int, local_head: int,
             width: int) -> np.ndarray:
    return (blocks[starts // per_block] * stride + local_head * per_block * width
            + (starts % per_block) * width)


def _tail_runs(index: int, p: TailGroupLayout, d: TailGroupLayout, prefill: SideLayout, p_slot: int,
               d_slot: int) -> list[RunSet]:
    """A replicated per-request page: each decode rank copies it whole from one prefill rank, spread over
    the prefill ranks as replicated token groups are."""
    if p.used_bytes != d.used_bytes:
        raise PlanError(f"the {p.name} page differs between the two sides")
    p_tp = prefill.side.tensor_parallel
    stages = _stage_layers(p.num_layers, prefill.side.pipeline_parallel)
    src = np.array([p_slot * p.slot_bytes], dtype=np.int64)
    dst = np.array([d_slot * d.slot_bytes], dtype=np.int64)
    length = np.array([p.used_bytes], dtype=np.int64)
    return [RunSet(p.name, p.kind, "tail", d_rank, stage * p_tp + (d_rank + index * d.tp) % p_tp, layers,
                   src, dst, length)
            for d_rank in range(d.tp) for stage, layers in stages.items()]


def _state_runs(p: StateGroupLayout, d: StateGroupLayout, prefill: SideLayout, p_slot: int,
                d_slot: int, merge: bool) -> list[RunSet]:
    p_tp = prefill.side.tensor_parallel
    d_tp = d.tp
    stages = _stage_layers(p.num_layers, prefill.side.pipeline_parallel)
    out = []
    for d_rank in range(d_tp):
        pieces: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = defaultdict(list)
        for (_, p_parts), (name, d_parts) in zip(p.tensors, d.tensors, strict=True):
            for p_part, d_part in zip(p_parts, d_parts, strict=True):
                if p_part.chunk_bytes != d_part.chunk_bytes:
                    raise PlanError(f"state tensor {name} of group {p.name} has different shapes "
                                    "on the two sides")
                heads = np.arange(d_rank * d_part.heads_local, (d_rank + 1) * d_part.heads_local)
                owners = heads // p_part.heads_local
                chunk = p_part.chunk_bytes
                src = p_slot * p.slot_bytes + p_part.offset + (heads - owners * p_part.heads_local) * chunk
                dst = d_slot * d.slot_bytes + d_part.offset + (heads - d_rank * d_part.heads_local) * chunk
                for owner in np.unique(owners):
                    mask = owners == owner
                    pieces[int(owner)].append((src[mask], dst[mask], np.full(int(mask.sum()), chunk)))
        for p_rank, parts in pieces.items():
            src, dst, length = _merge(parts, merge)
            for stage, layers in stages.items():
                out.append(RunSet(p.name, "state", "state", d_rank, stage * p_tp + p_rank, layers,
                                  src, dst, length))
    return out


def _merge(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
           merge: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Join runs that are contiguous on both sides; sorted by destination."""
    src = np.concatenate([p[0] for p in parts]).astype(np.int64)
    dst = np.concatenate([p[1] for p in parts]).astype(np.int64)
    length = np.concatenate([p[2] for p in parts]).astype(np.int64)
    order = np.argsort(dst, kind="stable")
    src, dst, length = src[order], dst[order], length[order]
    if not merge or len(dst) < 2:
        return src, dst, length
    joins = (dst[:-1] + length[:-1] == dst[1:]) & (src[:-1] + length[:-1] == src[1:])
    heads = np.flatnonzero(np.concatenate(([True], ~joins)))
    return src[heads], dst[heads], np.add.reduceat(length, heads)

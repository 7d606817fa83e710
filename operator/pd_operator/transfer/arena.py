"""One registered memory arena per rank, carved into the rank's per-layer KV tensors.

The serving pods register their KV tensors once at start-up; the simulated ranks do the same with
one numpy arena registered once, so a rank can be re-laid out (another pairing, another pool size)
without touching the engine's registration, which peers have cached through metadata discovery.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pd_operator.kv.simulate import Region, RegionKey

# Regions start on page boundaries, as the tensors of a real allocator would.
ALIGN = 4096


class ArenaTooSmall(ValueError):
    pass


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def region_offsets(regions: Iterable[Region]) -> tuple[dict[RegionKey, tuple[int, int]], int]:
    """(key -> (offset, bytes)) of each region laid back to back on page boundaries, and the total."""
    offsets, at = {}, 0
    for r in regions:
        offsets[r.key] = (at, r.nbytes)
        at += _aligned(r.nbytes)
    return offsets, at


def carve(memory: np.ndarray, regions: Iterable[Region]) -> dict[RegionKey, np.ndarray]:
    """Views of `memory` (a uint8 arena) holding each region."""
    offsets, total = region_offsets(regions)
    if total > len(memory):
        raise ArenaTooSmall(f"the regions need {total} bytes; the arena has {len(memory)}")
    return {key: memory[off: off + size] for key, (off, size) in offsets.items()}


def addresses(views: dict[RegionKey, np.ndarray]) -> dict[RegionKey, tuple[int, int]]:
    """(base address, bytes) of each view: what a rank publishes to its peers."""
    return {key: (int(v.ctypes.data), len(v)) for key, v in views.items()}

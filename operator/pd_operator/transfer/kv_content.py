"""One request's KV cache as a rank holds it: the content bytes a prefill rank writes (tagged per
request) and the check a decode rank runs on what it pulled. The KV-link probe uses both; the
transfer tests' rank processes (tests/support/ranks.py) too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.simulate import UNWRITTEN, RegionKey, regions, write_prompt
from pd_operator.transfer import arena

# What prefill memory holds outside any prompt: other requests' data, never the decode fill.
PREFILL_BACKGROUND = 0x5A


@dataclass(frozen=True)
class Request:
    """One request's cache on one side: its block table, state slot and prompt length."""

    blocks: np.ndarray
    slot: int
    prompt_tokens: int
    tag: int = 0
    """XORed into the request's content bytes, so two requests held by one prefill differ."""


def write_request(layout: SideLayout, rank: int, views: dict[RegionKey, np.ndarray], req: Request) -> None:
    """write_prompt, with the content bytes XORed by the request's tag. The content bytes are found
    by writing onto two different fills: they are the bytes that come out equal."""
    if req.tag == 0:
        write_prompt(layout, rank, views, req.blocks, req.slot, req.prompt_tokens)
        return
    low = {k: np.zeros_like(v) for k, v in views.items()}
    high = {k: np.full_like(v, 0xFF) for k, v in views.items()}
    for scratch in (low, high):
        write_prompt(layout, rank, scratch, req.blocks, req.slot, req.prompt_tokens)
    for key, view in views.items():
        content = low[key] == high[key]
        view[content] = low[key][content] ^ np.uint8(req.tag)


def differences(memory: np.ndarray, views: dict[RegionKey, np.ndarray], layout: SideLayout, rank: int,
                pool: tuple[int, int], requests: Sequence[Request]) -> list[str]:
    """Differences between an arena and a fresh arena in which this rank wrote the requests itself:
    wrong content, and any byte changed outside the content (the fresh arena holds UNWRITTEN)."""
    expected = np.full(len(memory), UNWRITTEN, dtype=np.uint8)
    expected_views = arena.carve(expected, regions(layout, rank, *pool))
    for req in requests:
        write_request(layout, rank, expected_views, req)
    if np.array_equal(expected, memory):
        return []
    problems = []
    base = int(memory.ctypes.data)
    covered = np.zeros(len(memory), dtype=bool)
    for key, view in views.items():
        bad = np.flatnonzero(view != expected_views[key])
        if len(bad):
            blank = int(np.count_nonzero(view[bad] == UNWRITTEN))
            problems.append(f"rank {rank} region {key}: {len(bad)} bytes differ ({blank} never written), "
                            f"first at offset {int(bad[0])}")
        start = int(view.ctypes.data) - base
        covered[start: start + len(view)] = True
    outside = np.flatnonzero((memory != expected) & ~covered)
    if len(outside):
        problems.append(f"rank {rank}: {len(outside)} bytes outside every region changed, "
                        f"first at arena offset {int(outside[0])}")
    return problems

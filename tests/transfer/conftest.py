"""Rank processes on loopback for the transfer tier: one pool of rank processes with P2P handshake
discovery (what vllm-ascend's PD connectors use), reused by every pairing."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from transfer_cases import POOL_SIZE, capacity

from support.ranks import RankWorker, start_workers

# The KV-link gate test runs rendered pods' commands and the controller's pure gate on them: it
# reuses the renderer's cases and the controller tests' pod builders rather than copying them.
TESTS = Path(__file__).resolve().parents[1]
for shared in ("render", "controller"):
    if str(TESTS / shared) not in sys.path:
        sys.path.append(str(TESTS / shared))


@pytest.fixture(scope="session")
def rank_pool() -> Iterator[list[RankWorker]]:
    workers = start_workers(POOL_SIZE, capacity())
    yield workers
    for w in workers:
        w.close()

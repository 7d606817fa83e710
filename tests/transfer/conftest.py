"""Rank processes on loopback for the transfer tier: one pool of rank processes with P2P handshake
discovery (what vllm-ascend's PD connectors use), reused by every pairing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.ranks import RankWorker, start_workers
from support.transfer_pairings import POOL_SIZE, capacity


@pytest.fixture(scope="session")
def rank_pool() -> Iterator[list[RankWorker]]:
    workers = start_workers(POOL_SIZE, capacity())
    yield workers
    for w in workers:
        w.close()

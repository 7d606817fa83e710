"""Rank processes on loopback for the transfer tier: one pool of rank processes per metadata
discovery mode (P2P handshake, the HTTP metadata server), reused by every pairing of that mode."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from transfer_cases import POOL_SIZE, capacity

from pd_operator.transfer.engine import P2P
from pd_operator.transfer.metadata_server import http_metadata_server
from pd_operator.transfer.ranks import RankWorker, start_workers


@pytest.fixture(scope="session", params=["p2p", "http"])
def discovery(request) -> Iterator[str]:
    """The metadata_server string every engine of the pool is opened with."""
    if request.param == "p2p":
        yield P2P
    else:
        with http_metadata_server() as url:
            yield url


@pytest.fixture(scope="session")
def rank_pool(discovery: str) -> Iterator[list[RankWorker]]:
    workers = start_workers(POOL_SIZE, discovery, capacity())
    yield workers
    for w in workers:
        w.close()

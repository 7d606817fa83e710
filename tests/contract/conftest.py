"""Fixtures of the contract tier: the pinned upstream trees (fetched once into .cache/upstream; `make
test` prepares them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pd_operator.serving_image.capabilities import RELEASES
from support import upstream


@pytest.fixture(scope="session", params=list(RELEASES))
def version(request) -> str:
    """Each vllm-ascend release the operator knows (pd_operator.serving_image.capabilities.RELEASES)."""
    return request.param


@pytest.fixture(scope="session")
def source(version) -> Path:
    """The unpacked source archive of that release (the directory holding vllm_ascend/, docs/, ...)."""
    return upstream.fetch(version)

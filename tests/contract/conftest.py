"""Fixtures of the contract tier: the pinned upstream trees (fetched once into .cache/upstream; `make
test` prepares them) and the renders of the examples (the renderer tests' helpers, from tests/render)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

RENDER_TESTS = str(Path(__file__).resolve().parents[1] / "render")
if RENDER_TESTS not in sys.path:
    sys.path.append(RENDER_TESTS)

from pd_operator.serving_image.capabilities import RELEASES  # noqa: E402
from support import upstream  # noqa: E402


@pytest.fixture(scope="session", params=list(RELEASES))
def version(request) -> str:
    """Each vllm-ascend release the operator knows (pd_operator.serving_image.capabilities.RELEASES)."""
    return request.param


@pytest.fixture(scope="session")
def source(version) -> Path:
    """The unpacked source archive of that release (the directory holding vllm_ascend/, docs/, ...)."""
    return upstream.fetch(version)

"""Golden files are rewritten only on request: `pytest tests/render --update-golden` or
PD_UPDATE_GOLDEN=1. (The option lives here, so pass the tests/render path with it.)"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/render/golden/*.yaml from the current renderer")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False)) or \
        os.environ.get("PD_UPDATE_GOLDEN") == "1"

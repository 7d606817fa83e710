"""The node tier prints its wall time and test count at the end of the run (from its first test's
set-up to its last test's teardown, which stops the node): CI's budget is watched from the log."""

from __future__ import annotations

import time

import pytest

_SPAN: dict[str, float] = {}
_COUNT: list[str] = []


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if nodeid.startswith("tests/node/"):
        _SPAN.setdefault("first", time.monotonic())
        _COUNT.append(nodeid)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    if nodeid.startswith("tests/node/"):
        _SPAN["last"] = time.monotonic()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if "last" in _SPAN:
        wall = _SPAN["last"] - _SPAN["first"]
        terminalreporter.write_line(f"node tier: {len(_COUNT)} tests in {wall:.0f} s wall time")

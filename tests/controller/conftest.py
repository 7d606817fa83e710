"""Fixtures for the controller's integration tests on the real control plane (tests/support): the
chart installed once per module as users install it, and operators started from it per test, each
as the chart's ServiceAccount with the chart's arguments (plus the test's)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator

import pytest

from support.cluster import ControlPlane
from support.installed import OperatorProcess, Release, helm_install, helm_uninstall, wait_webhook_called


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    installed = helm_install(control_plane, tmp_path_factory.mktemp("release"))
    yield installed
    # ALWAYS: the self-signed configuration fails closed and would refuse every later
    # PDDeployment write of the session once no operator serves it.
    helm_uninstall(control_plane, installed)


@pytest.fixture
def start_operator(control_plane: ControlPlane, release: Release, namespace: str,
                   tmp_path: pathlib.Path) -> Iterator[Callable[..., OperatorProcess]]:
    """`start(*extra_args, server=None, webhook=True)`: the chart's operator, started; with
    `webhook`, returns once the API server calls its webhook. Every one started is stopped after."""
    started: list[OperatorProcess] = []

    def start(*extra_args: str, server: str | None = None, webhook: bool = True) -> OperatorProcess:
        workdir = tmp_path / f"operator-{len(started)}"
        workdir.mkdir()
        op = release.operator(control_plane, workdir, server=server, extra_args=extra_args)
        op.start()
        started.append(op)
        if webhook:
            op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "its webhook configured")
            wait_webhook_called(control_plane, namespace)
        return op

    yield start
    for op in started:
        op.stop()

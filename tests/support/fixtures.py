"""pytest fixtures on the real control plane (registered for every test by tests/conftest.py).

- `control_plane` (session): ONE ControlPlane per test run, started when a test first asks for it.
  Its workdir (component logs, audit.log, kubeconfigs) is kept when any test failed, or always
  with PD_KEEP_CLUSTER=1; the path is printed at the end of the run.
- `namespace`: a fresh namespace for one test (with its `default` ServiceAccount), deleted after.
- `fault_proxy`: a FaultProxy in front of the session's API server, for one test.
- `fresh_control_plane`: a control plane of the test's own, for the few tests that must break or
  restart one; costs a start (a few seconds) per test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from support.cluster import ControlPlane, namespace_name
from support.faultproxy import FaultProxy


def _keep(request: pytest.FixtureRequest) -> bool:
    return bool(os.environ.get("PD_KEEP_CLUSTER")) or request.session.testsfailed > 0


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    cp = ControlPlane().start()
    yield cp
    cp.stop(keep=_keep(request))


@pytest.fixture
def fresh_control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    cp = ControlPlane().start()
    yield cp
    failed = getattr(request.node, "rep_call", None)
    cp.stop(keep=bool(os.environ.get("PD_KEEP_CLUSTER")) or bool(failed and failed.failed))


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    name = namespace_name(request.node.name)
    control_plane.create_namespace(name)
    yield name
    control_plane.delete_namespace(name)


@pytest.fixture
def fault_proxy(control_plane: ControlPlane) -> Iterator[FaultProxy]:
    with FaultProxy(control_plane) as proxy:
        yield proxy


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    # Lets fresh_control_plane see whether its test failed (rep_call), to keep its logs.
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report

"""pytest fixtures on the real control plane (registered for every test by tests/conftest.py).

- `control_plane` (session): ONE ControlPlane per test run, started when a test first asks for it.
  Its workdir (component logs, audit.log, kubeconfigs) is kept when any test failed, or always
  with PD_KEEP_CLUSTER=1; the path is printed at the end of the run.
- `namespace`: a fresh namespace for one test (with its `default` ServiceAccount), deleted after.
- `fault_proxy`: a FaultProxy in front of the session's API server, for one test.
- `fresh_control_plane`: a control plane of the test's own, for the few tests that must break or
  restart one; costs a start (a few seconds) per test.
- `node_cluster` (session): a control plane with one real node instead of kwok's (support/node.py),
  started when a `node` test first asks for it; its workdir is kept like `control_plane`'s.
- `release` (module): the chart installed as users install it (`helm install`), uninstalled after.
- `start_operator`: `start(*extra_args, server=None, webhook=True)` starts the chart's operator, as
  the chart's ServiceAccount with the chart's arguments (plus the test's); stopped after the test.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterator

import pytest

from support.cluster import ControlPlane, namespace_name
from support.faultproxy import FaultProxy
from support.installed import OperatorProcess, Release, helm_install, helm_uninstall, wait_webhook_called
from support.node import NodeCluster


def keep_workdir(request: pytest.FixtureRequest) -> bool:
    """Keep a control plane's workdir: a test of the run failed, or PD_KEEP_CLUSTER is set."""
    return bool(os.environ.get("PD_KEEP_CLUSTER")) or request.session.testsfailed > 0


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    cp = ControlPlane().start()
    yield cp
    cp.stop(keep=keep_workdir(request))


@pytest.fixture(scope="session")
def node_cluster(request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    cluster = NodeCluster().start()
    yield cluster
    cluster.stop(keep=keep_workdir(request))


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
    """Returns once the API server calls the operator's webhook when `webhook`."""
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


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    # Lets fresh_control_plane see whether its test failed (rep_call), to keep its logs.
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report

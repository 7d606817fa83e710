"""Fixtures of the fault tests: the chart installed on the session's real control plane, and the
real operator (the chart's command and ServiceAccount) started as each scenario needs.

The chart is installed with its webhook off: these scenarios are about the reconcile (a killed
operator must not make the self-signed webhook, which fails closed, refuse the next PDDeployment;
the invalid-update storm is what a cluster with the webhook down or set to Ignore sees). The
bad-input test installs its own release with the webhook on.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from support.cluster import ControlPlane
from support.installed import Release, helm_install, helm_uninstall
from support.operators import Operators, operators


@pytest.fixture
def release(control_plane: ControlPlane, namespace: str, tmp_path: pathlib.Path) -> Iterator[Release]:
    """The chart watching the test's namespace only (its namespaced RBAC): the operator never sees
    what earlier tests left in namespaces still being deleted."""
    installed = helm_install(control_plane, tmp_path, values=["webhook.enabled=false",
                                                              f"watchNamespaces={{{namespace}}}"])
    yield installed
    helm_uninstall(control_plane, installed)


@pytest.fixture
def operator(control_plane: ControlPlane, release: Release, tmp_path: pathlib.Path) -> Iterator[Operators]:
    """`operator.start(server=proxy.url, drift_interval_s=...)`; every one is stopped at the end and
    the test fails if one exited by itself."""
    yield from operators(control_plane, release, tmp_path)

"""Fixtures of the fault tests: a fresh emulated cluster per test and the real operator against it.

The bad-input strategies reuse the renderer tests' spec generator (tests/render); pytest only puts
a test directory on sys.path when it collects it, so that one is added here for runs of
tests/faults alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from operator_env import CRD, NAMESPACES

from pd_operator.controller.background import BackgroundOperator, operators
from pd_operator.devcluster import DevCluster

RENDER_TESTS = str(Path(__file__).resolve().parents[1] / "render")
if RENDER_TESTS not in sys.path:
    sys.path.append(RENDER_TESTS)


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    with DevCluster(crd_paths=[str(CRD)], namespaces=NAMESPACES) as running:
        running.run_workload_controllers(pod_ready=False)
        yield running


@pytest.fixture
def operator(cluster: DevCluster) -> Iterator[Callable[..., BackgroundOperator]]:
    """Start the real operator (`main.run`, as `pd-operator run`) against the cluster; stopped at the
    end of the test, which fails if it died with an error."""
    with operators(cluster.kubeconfig_path) as start:
        yield start

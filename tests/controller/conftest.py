"""Fixtures for the controller tests: the emulated API server with the generated CRD, and the real
operator (`main.run`, the same entry as `pd-operator run`) in a thread against it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from controller_support import CRD, example

from pd_operator.controller.background import BackgroundOperator, operators
from pd_operator.devcluster import DevCluster


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    with DevCluster(crd_paths=[str(CRD)], namespaces=("default", "other")) as running:
        running.run_workload_controllers(pod_ready=False)
        yield running


@pytest.fixture
def start_operator(cluster: DevCluster) -> Iterator[Callable[..., BackgroundOperator]]:
    with operators(cluster.kubeconfig_path) as start:
        yield start


@pytest.fixture
def glm() -> dict[str, Any]:
    return copy.deepcopy(example())

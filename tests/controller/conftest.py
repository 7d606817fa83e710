"""Fixtures for the controller tests: the emulated API server with the generated CRD, and the real
operator (`main.run`, the same entry as `pd-operator run`) in a thread against it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from controller_support import CRD, example, free_port

from pd_operator.controller.background import BackgroundOperator
from pd_operator.controller.main import Options
from pd_operator.devcluster import DevCluster


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    with DevCluster(crd_paths=[str(CRD)], namespaces=("default", "other")) as running:
        running.run_workload_controllers(pod_ready=False)
        yield running


@pytest.fixture
def start_operator(cluster: DevCluster) -> Iterator[Callable[..., BackgroundOperator]]:
    started: list[BackgroundOperator] = []

    def start(**overrides: Any) -> BackgroundOperator:
        settings = {"kubeconfig": cluster.kubeconfig_path, "webhook": False, "health_port": free_port(),
                    "metrics_port": free_port(), **overrides}
        options = Options(**settings)
        op = BackgroundOperator(options).start()
        started.append(op)
        return op

    yield start
    for op in started:
        if op.thread.is_alive():
            op.stop()
        assert op.error is None, repr(op.error)


@pytest.fixture
def glm() -> dict[str, Any]:
    return copy.deepcopy(example())

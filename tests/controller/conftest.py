"""Fixtures for the controller tests: the emulated API server with the generated CRD, and the real
operator (`main.run`, the same entry as `pd-operator run`) in a thread against it."""

from __future__ import annotations

import copy
import pathlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from pd_operator.controller.background import BackgroundOperator
from pd_operator.controller.main import Options
from pd_operator.devcluster import DevCluster

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "pd.serving.dev_pddeployments.yaml"
EXAMPLES = ROOT / "examples"
API = "pd.serving.dev/v1alpha1"


def example(name: str = "glm-5.3-flash-tp8-dp2tp4.yaml") -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


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

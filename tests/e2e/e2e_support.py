"""Shared by the e2e tests: settings from the environment, examples and polling.

Without PD_E2E_KUBECONFIG the tier runs against the test run's own control plane (tests/support:
kube-apiserver, etcd, controller-manager, scheduler, kwok NPU nodes) with the operator installed
by `helm install`, as a user would. PD_E2E_KUBECONFIG selects an external cluster instead.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBECONFIG = os.environ.get("PD_E2E_KUBECONFIG")
MODE = os.environ.get("PD_E2E_OPERATOR", "local") if KUBECONFIG else "installed"
"""installed: an operator with its webhook already serves the cluster (the chart's); local: the
tests run `pd-operator run` here against it, watching only the test namespace."""
NPU = os.environ.get("PD_E2E_NPU") == "1" or not KUBECONFIG
"""Whether serving pods can become Ready: NPU nodes, or kwok's fake ones on the launched cluster."""
GROUP, VERSION, PLURAL = "pd.serving.dev", "v1alpha1", "pddeployments"


def example(name: str = "glm-5.3-flash-tp8-dp2tp4.yaml") -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def wait_for(predicate: Callable[[], Any], timeout: float = 180.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")

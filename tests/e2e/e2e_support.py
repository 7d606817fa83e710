"""Shared by the real-cluster tests: settings from the environment, examples and polling."""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBECONFIG = os.environ.get("PD_E2E_KUBECONFIG")
MODE = os.environ.get("PD_E2E_OPERATOR", "local")
GROUP, VERSION, PLURAL = "pd.serving.dev", "v1alpha1", "pddeployments"


def example(name: str = "glm-5.3-flash-tp8-dp2tp4.yaml") -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")

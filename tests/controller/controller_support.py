"""Shared by the controller tests: paths, examples, free ports and polling."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "pd.serving.dev_pddeployments.yaml"
EXAMPLES = ROOT / "examples"
API = "pd.serving.dev/v1alpha1"


def example(name: str = "glm-5.3-flash-tp8-dp2tp4.yaml") -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")

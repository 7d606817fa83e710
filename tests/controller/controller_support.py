"""Shared by the controller tests: paths and examples."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example(name: str = "glm-5.3-flash-tp8-dp2tp4.yaml") -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())

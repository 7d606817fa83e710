"""The `vllm` tier's one way to ask vLLM 0.34 (and vllm-ascend 0.30.0rc2's rule) about configurations: all
cases go to one `vllm_venv/block_alignment.py` process in `.vllm-venv`, which prints one result per case."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support import upstream
from support.specs import ROOT

VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
ASCEND_SRC = upstream.source_dir("0.30.0rc2")
"""vllm-ascend's unpacked source archive, as `make upstream` fetches it (sha256-pinned)."""
PROGRAMS = Path(__file__).parent / "vllm_venv"
PROBE = PROGRAMS / "block_alignment.py"
HF_CONFIGS = ROOT / "tests" / "kv" / "hf_configs"


def run_probe(cases: list[dict]) -> dict[str, dict]:
    """id -> {"block", "paddedStatePage"} or {"refused"}; fails the test when the tier is not installed."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env` to install vLLM's config code")
    argv = [str(VLLM_PYTHON), str(PROBE)]
    if any(c.get("platform") == "ascend" or c.get("configOnly") for c in cases):
        argv += ["--ascend-src", str(ascend_src())]
    done = subprocess.run(argv, input=json.dumps(cases), capture_output=True, text=True, timeout=900,
                          cwd=ROOT, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(cases), done.stderr[-3000:]
    return {row["id"]: row for row in rows}


def ascend_src() -> Path:
    """ASCEND_SRC; fails the test when `make upstream` has not fetched it."""
    if not (ASCEND_SRC / "PKG-INFO").exists():
        pytest.fail(f"{ASCEND_SRC} is missing: run `make upstream` to fetch vllm-ascend's source")
    return ASCEND_SRC


def vllm_venv_program(name: str) -> Path:
    """A program of `vllm_venv/` to run with VLLM_PYTHON; fails the test when the tier is not installed."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env` to install vLLM's config code")
    return PROGRAMS / name


def hf_config(folder: str) -> dict:
    return json.loads((HF_CONFIGS / folder / "config.json").read_text())

"""Benches that cannot rot (issue 23): every bench/*.py runs here in its quick mode, as `make bench`
would run it, and must exit 0 and print every figure its docstring documents, as numbers. A bench
no test ran went unnoticed once (bench/reconcile.py applied PDRoles to a server without their CRD).

What the figures say is not judged: quick mode's sizes are too small to mean much, and speed is the
bench's to print against its own baseline, not a test's to assert.
"""

from __future__ import annotations

import ast
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.bench import documented
from support.kube import ROOT

pytestmark = pytest.mark.bench

BENCH = ROOT / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))
# The benches' shared preamble, the one module there that is not a bench.
NOT_BENCHES = {"_paths.py"}
HANG_S = 540.0  # below pytest's 600 s: a hung bench is interrupted here and its output shown


def run_quick(script: Path) -> tuple[int, str, str]:
    """`python SCRIPT --quick`; a hung one gets SIGINT first, so its control plane is stopped."""
    process = subprocess.Popen([sys.executable, str(script), "--quick"], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        pytest.fail(f"{script.name} --quick still running after {HANG_S:.0f} s:\n{out}\n{err[-3000:]}")
    return process.returncode, out, err


def test_every_module_in_bench_is_a_bench_or_the_preamble():
    assert SCRIPTS, f"no bench scripts under {BENCH}"
    assert {p.name for p in BENCH.glob("_*.py")} <= NOT_BENCHES, "a bench named _*.py would go unrun"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_quick_mode_prints_every_documented_figure(script: Path):
    names = documented(ast.get_docstring(ast.parse(script.read_text())) or "")
    code, out, err = run_quick(script)
    assert code == 0, f"{script.name} --quick exited {code}:\n{out}\n{err[-3000:]}"
    printed: dict[str, str] = {}
    for line in out.splitlines():
        if not line.strip() or line.startswith("#"):  # context, e.g. the Kubernetes version
            continue
        name, sep, value = line.partition(": ")
        assert sep and name not in printed, f"{script.name}: not one `name: value` line per figure: {line!r}"
        printed[name] = value
    assert list(printed) == names, f"{script.name} printed other figures than its docstring lists"
    for name, value in printed.items():
        try:
            numbers = [float(v) for v in value.split()]
        except ValueError:
            numbers = []
        assert numbers and all(map(math.isfinite, numbers)), f"{script.name}: {name}: {value!r}: not a number"

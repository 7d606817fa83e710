"""Puts tests/ on sys.path for the bench scripts: they run outside pytest and use the test control
plane and its helpers (`support.*`, tests/support/README.md). Not a bench itself (the leading
underscore: tests/bench runs every other bench/*.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

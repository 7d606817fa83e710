"""The security tests reuse the renderer's cases (tests/render) and the chart's helm runner
(tests/chart) rather than copying them; pytest only puts a test directory on sys.path when it
collects it, so they are added here for runs of tests/security alone."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for shared in ("render", "chart"):
    path = str(TESTS / shared)
    if path not in sys.path:
        sys.path.append(path)

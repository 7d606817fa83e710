"""`make demo` refuses an incompatible manifest before it starts anything (tests/node/test_demo.py runs it
end to end on the real node)."""

from __future__ import annotations

import pathlib

from support import demo

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_demo_refuses_an_incompatible_manifest_before_starting(capsys):
    assert demo.main([str(EXAMPLES / "incompatible-glm-tp8-tp3.yaml")]) == 1
    out = capsys.readouterr().out
    assert "HeadsNotDivisibleByTP at spec.decode.tensorParallelSize" in out and "starting" not in out

"""`make demo` runs end to end and shows what kubectl would."""

from __future__ import annotations

import pytest
from controller_support import EXAMPLES

from pd_operator import demo

pytestmark = pytest.mark.integration


def test_demo_reaches_ready_and_prints_the_printer_columns(capsys):
    assert demo.main([str(EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml")]) == 0
    out = capsys.readouterr().out
    header, row = next((lines[i], lines[i + 1]) for lines in [out.splitlines()]
                       for i in range(len(lines)) if lines[i].startswith("NAME "))
    assert header.split() == ["NAME", "PREFILL", "DECODE", "COMPATIBLE", "READY", "REASON", "AGE"]
    assert row.split()[:6] == ["glm-flash", "1xTP8", "1xDP2xTP4", "True", "True", "Serving"]
    assert out.count("owner PDDeployment/glm-flash") == 10


def test_demo_refuses_an_incompatible_manifest(capsys):
    assert demo.main([str(EXAMPLES / "incompatible-glm-tp8-tp3.yaml")]) == 1
    assert "HeadsNotDivisibleByTP at spec.decode.tensorParallelSize" in capsys.readouterr().out


def test_printer_column_paths():
    obj = {"status": {"conditions": [{"type": "Ready", "status": "False"}], "prefill": {"shape": "1xTP8"}}}
    assert demo.column(obj, '.status.conditions[?(@.type=="Ready")].status') == "False"
    assert demo.column(obj, '.status.conditions[?(@.type=="KVCompatible")].status') == ""
    assert demo.column(obj, ".status.prefill.shape") == "1xTP8"
    assert demo.column(obj, ".status.decode.shape") == ""

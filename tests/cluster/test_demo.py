"""`make demo` runs end to end on the real control plane and shows what kubectl shows."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from pd_operator.render import render
from support import demo
from support.specs import resolve

pytestmark = pytest.mark.integration

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
CRD = pathlib.Path(__file__).resolve().parents[2] / "crds" / "pd.serving.dev_pddeployments.yaml"


def test_demo_installs_applies_and_reaches_ready(capsys):
    assert demo.main([str(EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "Server Version: v1.36.3" in lines
    assert any(line.startswith("== helm install pd-operator charts/pd-operator") for line in lines)
    table = next(i for i, line in enumerate(lines) if line.startswith("== kubectl get pdd"))
    header, row = lines[table + 1], lines[table + 2]
    columns = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["additionalPrinterColumns"]
    assert header.split() == ["NAME", *(c["name"].upper() for c in columns)]
    assert row.split()[:6] == ["glm-flash", "1xTP8", "1xDP2xTP4", "True", "True", "Serving"]
    children = [line.split() for line in lines if line.endswith(" glm-flash") and len(line.split()) == 3]
    rendered = render(resolve(yaml.safe_load((EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml").read_text())))
    assert len(children) == len(rendered)
    assert {c[0] for c in children} >= {"StatefulSet", "Deployment", "Service"}
    pods = [line.split() for line in lines if line.startswith("glm-flash-") and " Running " in line]
    assert len(pods) == 3 and all(p[1].split("/")[0] == p[1].split("/")[1] for p in pods)
    assert "0 refused" in out


def test_demo_refuses_an_incompatible_manifest_before_starting(capsys):
    assert demo.main([str(EXAMPLES / "incompatible-glm-tp8-tp3.yaml")]) == 1
    out = capsys.readouterr().out
    assert "HeadsNotDivisibleByTP at spec.decode.tensorParallelSize" in out and "starting" not in out

"""`pdctl render ... | kubectl apply --dry-run=server -f -` on the real control plane: the YAML text
pdctl writes reads back in kubectl (go-yaml) with every string a string, for generated deployment names
(their revisions and kv-layout hashes as they come) and for hand-picked hashes of each risky kind
forced into the revisions and the kv-layout hash (render/yaml_text.py)."""

from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path

import pytest
import yaml

from pd_operator import cli
from pd_operator.render import workloads
from pd_operator.spec import validate as spec_validate
from support.installed import install_crds
from support.kube import kubectl
from support.specs import example

pytestmark = pytest.mark.integration

GLM = "glm-5.3-flash-1p1d-tp4.yaml"
NAMES = 1000
"""Generated names per run (a plain revision misread by kubectl comes about once in a hundred); the
risky kinds are forced below. Validating and rendering them all takes most of this test's time (about
2.5 min on an idle 2-core machine), hence its own timeout."""
RISKY = ["0569510914", "0123456789", "1234567890", "1234567e12", "0e12345678", "12345e6789"]
"""A leading zero (no octal), all digits, digits with one `e`."""


def pdctl_render(docs: list[dict], tmp_path: Path) -> str:
    """`pdctl render FILE` of these PDDeployments: its standard output."""
    path = tmp_path / "deployments.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["render", str(path)]) == 0
    return out.getvalue()


def kubectl_dry_run(control_plane, text: str) -> None:
    done = kubectl(control_plane.kubeconfig, "apply", "--dry-run=server", "-f", "-", input=text, check=False,
                   timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "expected string" not in done.stderr and "cannot unmarshal" not in done.stderr


@pytest.fixture(scope="module")
def crds(control_plane):
    install_crds(control_plane)


@pytest.mark.timeout(1800)
def test_generated_names_apply_as_rendered(control_plane, crds, namespace, tmp_path):
    rng = random.Random(30)
    docs = []
    for i in range(NAMES):
        doc = example(GLM, namespace)
        doc["metadata"]["name"] = f"g{i}-{rng.randrange(16 ** 6):06x}"
        docs.append(doc)
    text = pdctl_render(docs, tmp_path)
    assert text.count("\nkind: StatefulSet\n") == 2 * NAMES
    kubectl_dry_run(control_plane, text)


@pytest.mark.parametrize("value", RISKY)
def test_risky_hashes_apply_as_rendered(control_plane, crds, namespace, tmp_path, monkeypatch, value):
    monkeypatch.setattr(workloads, "revision", lambda template: value)
    monkeypatch.setattr(spec_validate, "layout_hash", lambda *args: value)
    text = pdctl_render([example(GLM, namespace)], tmp_path)
    kubectl_dry_run(control_plane, text)
    assert f"pd.serving.dev/revision: '{value}'" in text and f"pd.serving.dev/kv-layout: '{value}'" in text

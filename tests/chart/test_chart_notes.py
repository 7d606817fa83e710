"""NOTES.txt tells the user the next commands, and those commands work on the repository's example."""

from __future__ import annotations

import subprocess

import yaml

from support.helm_chart import REPO, notes

EXAMPLE = "examples/glm-5.3-flash-tp8-dp2tp4.yaml"


def _pdd_short_name() -> list[str]:
    crd = yaml.safe_load((REPO / "crds" / "pd.serving.dev_pddeployments.yaml").read_text())
    return crd["spec"]["names"]["shortNames"]


def test_notes_point_at_the_example_and_the_short_name():
    text = notes("default")
    assert f"kubectl apply -f {EXAMPLE}" in text
    assert "kubectl get pdd -n default" in text
    assert "kubectl -n pd-system rollout status deployment/pdo-pd-operator" in text
    assert "pdd" in _pdd_short_name()
    # The plain `kubectl apply` is only right while the example stays in namespace default.
    example = yaml.safe_load((REPO / EXAMPLE).read_text())
    assert example["kind"] == "PDDeployment" and example["metadata"]["namespace"] == "default"


def test_namespaced_notes_move_the_example_into_a_served_namespace():
    text = notes("namespaced")
    assert "kubectl get pdd -n llm-prod" in text
    (sed,) = [line.strip() for line in text.splitlines() if line.strip().startswith("sed ")]
    command = sed.removesuffix("\\").strip()
    moved = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert yaml.safe_load(moved)["metadata"]["namespace"] == "llm-prod"


def test_notes_warn_when_the_webhook_is_off():
    assert "WARNING: the admission webhook is off" in notes("webhook-off")
    assert "WARNING" not in notes("default")

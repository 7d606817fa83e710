"""A webhook problem never stops the operator: it keeps reconciling, says what is wrong in its
/healthz and log, and retries until the webhook serves and is configured (real control plane,
the chart installed, the operator as the chart's ServiceAccount)."""

from __future__ import annotations

import pathlib
import socket
from collections.abc import Iterator

import pytest
import yaml

from support.cluster import ControlPlane, wait_for
from support.installed import Release, helm_install, helm_uninstall, is_ready
from support.kube import kubectl
from support.specs import example

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "glm-5.3-flash-1p1d-tp4.yaml"
INCOMPATIBLE = ROOT / "examples" / "incompatible-glm-tp8-tp3.yaml"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def _webhook(health: dict) -> dict:
    return dict(health.get("webhook") or {})


@pytest.fixture
def release(control_plane: ControlPlane, tmp_path: pathlib.Path) -> Iterator[Release]:
    installed = helm_install(control_plane, tmp_path, release="pd-supervised")
    yield installed
    helm_uninstall(control_plane, installed)


def _apply(cp: ControlPlane, path: pathlib.Path, namespace: str, check: bool = True):
    doc = example(path, namespace)
    return kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc), check=check), doc


def test_operator_reconciles_while_its_webhook_cannot_serve_or_be_configured(
        control_plane, namespace, release, tmp_path):
    cp = control_plane
    (config,) = release.find("ValidatingWebhookConfiguration")
    config_name = config["metadata"]["name"]
    # Two faults at once: the webhook's port is taken, and its configuration is gone.
    cp.api("DELETE", f"{CONFIGS}/{config_name}")
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with release.operator(cp, tmp_path, extra_args=[f"--webhook-port={port}"]) as op:
            health = op.wait_health(lambda h: "cannot serve" in _webhook(h).get("message", ""),
                                    "the port refused")
            assert _webhook(health)["ok"] is False

            # Reconciling goes on: the example reaches Ready with the webhook down.
            cp.create_weights_volume(namespace, "glm-5.3-flash-weights")
            _, doc = _apply(cp, EXAMPLE, namespace)
            wait_for("Ready without a webhook", lambda: is_ready(cp, namespace, doc["metadata"]["name"]), 300)

            holder.close()
            health = op.wait_health(lambda h: "cannot configure" in _webhook(h).get("message", ""),
                                    "serving, configuration missing")
            assert "not found" in _webhook(health)["message"].lower() and not _webhook(health)["ok"]

            cp.api("POST", CONFIGS, {"apiVersion": "admissionregistration.k8s.io/v1",
                                     "kind": "ValidatingWebhookConfiguration",
                                     "metadata": {"name": config_name}, "webhooks": []})
            op.wait_health(lambda h: _webhook(h).get("ok") is True, "configured after the retry", timeout=180)
            refused, _ = _apply(cp, INCOMPATIBLE, namespace, check=False)
            assert refused.returncode != 0 and "denied the request" in refused.stderr, refused.stderr
            assert op.running()
        log = op.output()
        assert "cannot serve on port" in log
        assert f"cannot configure ValidatingWebhookConfiguration {config_name}" in log
    finally:
        holder.close()

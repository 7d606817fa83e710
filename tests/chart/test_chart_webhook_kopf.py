"""The chart's self-signed webhook wiring on the real control plane: `helm install` creates an empty
ValidatingWebhookConfiguration; the operator, started with the chart's arguments, the POD_IP the
chart sets and the chart's ServiceAccount, fills it with one webhook at the pod IP and its own CA,
and the API server then calls it."""

from __future__ import annotations

import base64
import pathlib

import pytest

from pd_operator.api.types import GROUP, PLURAL
from pd_operator.controller.webhook import WEBHOOK_ID, WEBHOOK_NAME
from support.cluster import ControlPlane
from support.installed import helm_install, helm_uninstall

pytestmark = pytest.mark.integration

CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def test_operator_fills_the_charts_webhook_configuration(control_plane: ControlPlane, tmp_path: pathlib.Path):
    cp = control_plane
    release = helm_install(cp, tmp_path, release="pdo-webhook")
    try:
        (config,) = release.find("ValidatingWebhookConfiguration")
        assert config["webhooks"] == []
        path = f"{CONFIGS}/{config['metadata']['name']}"
        assert not cp.api("GET", path).get("webhooks")
        with release.operator(cp, tmp_path) as op:
            op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "its webhook configured")
            port = next(a.split("=", 1)[1] for a in op.argv if a.startswith("--webhook-port="))
            (hook,) = cp.api("GET", path)["webhooks"]
    finally:
        helm_uninstall(cp, release)

    assert hook["name"] == WEBHOOK_NAME
    assert hook["clientConfig"]["url"] == f"https://127.0.0.1:{port}/{WEBHOOK_ID}"
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
    assert hook["failurePolicy"] == "Fail"
    assert hook.get("namespaceSelector", {}) == {}  # cluster-wide mode judges every namespace
    (rule,) = hook["rules"]
    assert (rule["apiGroups"], rule["resources"]) == ([GROUP], [PLURAL])
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}

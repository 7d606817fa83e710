"""The chart's self-signed webhook wiring works with the real operator: started with the flags the
chart renders and the POD_IP it sets, `pd-operator run` (through kopf) fills the chart's empty
ValidatingWebhookConfiguration with a webhook at the pod IP and its own CA (emulated API server)."""

from __future__ import annotations

import base64
import socket
import threading
import time

import pytest
from chart_render import REPO, find, operator_container, rendered

from pd_operator.controller.main import options_from, run
from pd_operator.devcluster import DevCluster

pytestmark = pytest.mark.integration

ADMISSION = "admissionregistration.k8s.io/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_free_ports(args: list[str]) -> list[str]:
    # The chart's fixed ports could be taken on a shared test machine.
    ports = {f"--{name}-port=": _free_port() for name in ("health", "metrics", "webhook")}
    return [next((f"{p}{n}" for p, n in ports.items() if a.startswith(p)), a) for a in args]


def test_operator_fills_the_charts_webhook_configuration(monkeypatch):
    docs = rendered("default")
    (config,) = find(docs, "ValidatingWebhookConfiguration")
    assert config["webhooks"] == []
    name = config["metadata"]["name"]
    args = _with_free_ports(operator_container(docs)["args"])
    webhook_port = next(a.split("=", 1)[1] for a in args if a.startswith("--webhook-port="))
    monkeypatch.setenv("POD_IP", "127.0.0.1")  # the chart sets it from status.podIP

    crd = REPO / "crds" / "pd.serving.dev_pddeployments.yaml"
    with DevCluster(crd_paths=[str(crd)], namespaces=("default",)) as cluster:
        cluster.create(config)
        options = options_from([*args, f"--kubeconfig={cluster.kubeconfig_path}"])
        stop, ready, errors = threading.Event(), threading.Event(), []

        def operate() -> None:
            try:
                run(options, stop_flag=stop, ready_flag=ready)
            except BaseException as err:  # reported below
                errors.append(err)

        thread = threading.Thread(target=operate, daemon=True)
        thread.start()
        try:
            assert ready.wait(20), errors
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                hooks = cluster.get(ADMISSION, "ValidatingWebhookConfiguration", None, name)["webhooks"]
                if hooks:
                    break
                time.sleep(0.1)
        finally:
            stop.set()
            thread.join(20)

    assert errors == [] and not thread.is_alive()
    (hook,) = hooks
    assert hook["clientConfig"]["url"] == f"https://127.0.0.1:{webhook_port}/validate-pddeployment"
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
    assert hook["failurePolicy"] == "Fail"
    (rule,) = hook["rules"]
    assert (rule["apiGroups"], rule["resources"]) == (["pd.serving.dev"], ["pddeployments"])
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}

"""A tiny real kopf operator against the emulator: the end-to-end check that kopf is satisfied."""

from __future__ import annotations

import textwrap
import time

import kubernetes
import pytest
from kopf.testing import KopfRunner

pytestmark = pytest.mark.integration

HANDLERS = textwrap.dedent("""
    import kopf
    import kubernetes


    @kopf.on.login()
    def login(**kwargs):
        return kopf.login_via_client(**kwargs)


    @kopf.on.create("test.pd.dev", "v1", "widgets")
    def create_child(body, spec, name, namespace, patch, **_):
        child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-child"},
                 "data": {"size": str(spec["size"])}}
        kopf.adopt(child, owner=body)
        kubernetes.client.CoreV1Api().create_namespaced_config_map(namespace, child)
        patch.status["phase"] = "Ready"
        kopf.info(body, reason="ChildCreated", message=child["metadata"]["name"])  # POSTs an Event
        return {"child": child["metadata"]["name"]}
""")


def test_kopf_operator_creates_child_and_writes_status(cluster, widget, tmp_path, monkeypatch):
    # login_via_client() -> load_kube_config() reads the default path captured at import time.
    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig_path)
    monkeypatch.setattr(
        kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", cluster.kubeconfig_path
    )
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", None)  # restored afterwards
    handlers = tmp_path / "handlers.py"
    handlers.write_text(HANDLERS)
    cluster.create(widget("w", namespace="default", spec={"size": 3}))

    args = ["run", "--standalone", "--namespace=default", "--verbose", str(handlers)]
    with KopfRunner(args, timeout=30) as runner:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status = (cluster.get("test.pd.dev/v1", "Widget", "default", "w") or {}).get("status", {})
            posted = cluster.list("v1", "Event", "default")
            if status.get("phase") == "Ready" and status.get("create_child") and posted:
                break
            time.sleep(0.1)

    assert runner.exception is None and runner.exit_code == 0, runner.output[-3000:]
    child = cluster.get("v1", "ConfigMap", "default", "w-child")
    assert child is not None and child["data"] == {"size": "3"}
    owner = cluster.get("test.pd.dev/v1", "Widget", "default", "w")
    assert child["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    assert owner["status"] == {"phase": "Ready", "create_child": {"child": "w-child"}}
    events = cluster.list("v1", "Event", "default")
    assert [(e["reason"], e["involvedObject"]["uid"]) for e in events] == [
        ("ChildCreated", owner["metadata"]["uid"])
    ]
    statuses = {r.status for r in cluster.requests if r.status is not None}
    assert statuses <= {200, 201}, runner.output[-3000:]

    cluster.delete("test.pd.dev/v1", "Widget", "default", "w")
    assert cluster.get("v1", "ConfigMap", "default", "w-child") is None

"""The test control plane itself (tests/support): what the other tiers rely on.

Real components at the pinned version, NPU nodes that run pods through kwok, the audit log naming
users and codes, TokenRequest identities, and the fault proxy's faults, counts and write hooks.
"""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from support.cluster import ControlPlane, kubernetes_version, service_account_user, wait_for
from support.faultproxy import FaultProxy
from support.kube import kubectl

pytestmark = pytest.mark.integration


def _config_map(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


def test_server_version_and_npu_nodes(control_plane: ControlPlane):
    version = json.loads(kubectl(control_plane.kubeconfig, "version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == kubernetes_version()
    nodes = control_plane.api("GET", "/api/v1/nodes")["items"]
    npus = {n["metadata"]["name"]: n["status"]["allocatable"] for n in nodes}
    assert any(a.get("huawei.com/Ascend910") == "8" for a in npus.values())
    assert any(a.get("huawei.com/ascend-1980") == "16" for a in npus.values())
    a3 = [n for n in nodes if n["metadata"]["labels"].get("accelerator") == "ascend-a3"]
    assert a3 and all(n["status"]["allocatable"].get("huawei.com/ascend-1980") == "16" for n in a3)


def test_a_pod_asking_for_npus_is_scheduled_and_run_by_kwok(control_plane: ControlPlane, namespace: str):
    cp = control_plane
    cp.api("POST", f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "npu"},
        "spec": {"containers": [{"name": "c", "image": "none", "resources": {
            "limits": {"huawei.com/Ascend910": "8"}, "requests": {"huawei.com/Ascend910": "8"}}}]}})

    def ready() -> dict | None:
        pod = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods/npu")
        conditions = pod.get("status", {}).get("conditions", [])
        return pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    pod = wait_for("the pod Ready", ready)
    assert pod["spec"]["nodeName"].startswith("ascend910-")


def test_service_account_token_is_that_user_in_the_audit_log(control_plane: ControlPlane, namespace: str,
                                                             tmp_path):
    cp = control_plane
    mark = cp.audit.mark()
    config = cp.service_account_kubeconfig(namespace, "default", tmp_path / "sa.kubeconfig")
    denied = kubectl(config, "get", "secrets", "-n", namespace, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr
    user = service_account_user(namespace, "default")
    refused = wait_for("the audit event", lambda: cp.audit.forbidden(mark, user=user))
    assert [(e.verb, e.resource, e.namespace) for e in refused] == [("list", "secrets", namespace)]


def test_fault_proxy_faults_counts_and_hooks(control_plane: ControlPlane, namespace: str, tmp_path):
    cp = control_plane
    with FaultProxy(cp) as proxy:
        config = proxy.kubeconfig(tmp_path / "proxy.kubeconfig", cp.admin_token)
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        conflict = proxy.inject(verb="create", resource="configmaps", status=409)
        hooked: list[str] = []
        fired = proxy.on_write(2, lambda r: hooked.append(r.name), verb="create")

        # `kubectl create -f` sends JSON, as the operator does (the proxy reads a created name from it).
        def create(name: str, check: bool = True):
            return kubectl(config, "create", "-n", namespace, "-f", "-", input=json.dumps(_config_map(name)),
                           check=check)

        first = create("a", check=False)
        assert first.returncode != 0 and "injected by the test fault proxy" in first.stderr
        assert conflict.hits == 1 and not cp.exists(f"{path}/a")
        create("a")
        create("b")
        assert fired.is_set() and hooked == ["b"]
        assert [(w.verb, w.name, w.status) for w in proxy.writes] == [
            ("create", "a", 201), ("create", "b", 201)]

        # 5xx after the API server applied the write: the object exists, the client saw 500.
        proxy.inject(verb="create", resource="configmaps", status=500, after_forward=True)
        lost = create("c", check=False)
        assert lost.returncode != 0 and cp.exists(f"{path}/c")

        # A dropped connection: nothing forwarded.
        drop = proxy.inject(verb="get", resource="configmaps", name="a", drop=True, times=None)
        dropped = kubectl(config, "get", "configmap", "a", "-n", namespace, "--request-timeout=10s",
                          check=False)
        assert dropped.returncode != 0 and drop.hits >= 1
        proxy.clear()
        assert kubectl(config, "get", "configmap", "a", "-n", namespace).returncode == 0


def _open_watch(proxy: FaultProxy, cp: ControlPlane, path: str):
    request = urllib.request.Request(f"{proxy.url}{path}?watch=true&allowWatchBookmarks=false",
                                     headers={"Authorization": f"Bearer {cp.admin_token}"})
    return urllib.request.urlopen(request, context=cp.ssl_context, timeout=60)


def test_watches_stream_through_the_proxy_until_cut(control_plane: ControlPlane, namespace: str):
    cp = control_plane
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    with FaultProxy(cp) as proxy:
        stream = _open_watch(proxy, cp, path)
        cp.api("POST", path, _config_map("streamed"))
        # The watch starts with what exists (the namespace's kube-root-ca.crt), then streams.
        names = []
        while "streamed" not in names:
            event = json.loads(stream.readline())
            names.append(event["object"]["metadata"]["name"])
            assert event["type"] == "ADDED"

        wait_for("the watch registered", lambda: any(r.verb == "watch" for r in proxy.requests))
        done = threading.Event()

        def drain() -> None:
            try:
                while stream.readline():
                    pass
            except OSError:
                pass
            done.set()

        threading.Thread(target=drain, daemon=True).start()
        assert proxy.cut_watches() == 1
        assert done.wait(30), "the watch was not cut"

        proxy.inject(verb="watch", resource="configmaps", status=410)
        expired = _open_watch(proxy, cp, path)
        event = json.loads(expired.readline())
        assert event["type"] == "ERROR" and event["object"]["code"] == 410

"""The pure parts of the pod network (support/podnet.py, support/poddns.py): which pod names resolve,
to what, and how a proxy pod's command is made to work on loopback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from support.cluster import DEFAULT_NODES
from support.poddns import pod_resolver
from support.podnet import in_pod, loopback, pod_dns

pytestmark = pytest.mark.scaling

NS = "ns"


def _pod(name: str, subdomain: str, ip: str | None, ready: bool, labels: dict[str, str]) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"hostname": name, "subdomain": subdomain},
            "status": {**({"podIP": ip} if ip else {}),
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


def _headless(name: str, selector: dict[str, str], not_ready: bool) -> dict:
    return {"metadata": {"name": name},
            "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": not_ready}}


def test_pod_names_are_those_of_pods_a_headless_service_selects():
    pods = [_pod("d-0-0", "d-0", "127.9.0.1", False, {"i": "0"}),   # not ready, published anyway
            _pod("d-1-0", "d-1", "127.9.0.2", False, {"i": "1"}),   # not ready, not published
            _pod("d-2-0", "d-2", "127.9.0.3", True, {"i": "2"}),
            _pod("d-3-0", "d-3", "127.9.0.4", True, {"i": "other"}),  # not selected
            _pod("d-4-0", "d-4", None, True, {"i": "4"}),           # no IP yet
            _pod("d-5-0", "d-5", "127.9.0.6", True, {"i": "5"})]    # no Service
    services = [_headless("d-0", {"i": "0"}, True), _headless("d-1", {"i": "1"}, False),
                _headless("d-2", {"i": "2"}, False), _headless("d-3", {"i": "3"}, True),
                _headless("d-4", {"i": "4"}, True),
                {"metadata": {"name": "d-5"}, "spec": {"clusterIP": "10.96.0.9", "selector": {"i": "5"}}}]
    assert pod_dns(NS, pods, services) == {"d-0-0.d-0.ns.svc": "127.9.0.1", "d-2-0.d-2.ns.svc": "127.9.0.3"}


def test_cluster_names_resolve_from_the_file_and_others_as_usual(tmp_path: Path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps({"d-0-0.d-0.ns.svc": "127.9.0.1"}))
    asked: list[tuple] = []
    resolve = pod_resolver(hosts, lambda *args: asked.append(args) or [args])
    for name in ("d-0-0.d-0.ns.svc", "d-0-0.d-0.ns.svc.cluster.local.", b"d-0-0.d-0.ns.svc"):
        want = [("127.9.0.1", 8000, 0, socket.SOCK_STREAM, 0, 0)]
        assert resolve(name, 8000, 0, socket.SOCK_STREAM) == want
    assert resolve("example.org", 443) == [("example.org", 443, 0, 0, 0, 0)]
    with pytest.raises(socket.gaierror, match="no such pod"):
        resolve("d-1-0.d-1.ns.svc", 8000)
    hosts.write_text(json.dumps({"d-1-0.d-1.ns.svc": "127.9.0.2"}))  # re-read at every lookup
    assert resolve("d-1-0.d-1.ns.svc", 8000)[0][0] == "127.9.0.2"
    assert len(asked) == 5


def test_a_command_runs_in_the_pod_on_its_own_address_and_its_volumes(tmp_path: Path):
    mounts = {"/etc/pd-proxy": tmp_path / "membership"}
    argv = ["pd-proxy", "--membership", "/etc/pd-proxy/upstreams.json", "--host", "0.0.0.0", "--port", "8000",
            "--log", "/etc/pd-proxy-other/x"]
    assert [in_pod(a, "127.9.0.7", mounts) for a in argv] == [
        "pd-proxy", "--membership", str(tmp_path / "membership" / "upstreams.json"), "--host", "127.9.0.7",
        "--port", "8000", "--log", "/etc/pd-proxy-other/x"]


def test_loopback_nodes_get_a_loopback_slash_24_each():
    pool = loopback(DEFAULT_NODES[0])
    cidrs = [n["spec"]["podCIDR"] for n in pool.nodes()]
    assert len(set(cidrs)) == pool.count == DEFAULT_NODES[0].count
    assert all(c.startswith("127.") and c.endswith(".0/24") for c in cidrs)
    assert "spec" not in DEFAULT_NODES[0].nodes()[0]

"""The fault injector: deterministic API failures for the faults tier."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse

import pytest
from kubernetes.client.rest import ApiException

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def raw_get(cluster, path: str) -> tuple[int, bytes]:
    host, port = urllib.parse.urlparse(cluster.url).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_500_on_list_only(cluster, core):
    core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    cluster.faults.configure(rate=1.0, kinds=["500"], verbs=["list"])
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map("default")
    assert err.value.status == 500 and json.loads(err.value.body)["kind"] == "Status"
    assert core.read_namespaced_config_map("a", "default").metadata.name == "a"  # get is unaffected
    assert cluster.faults.injected == {"500": 1}
    assert cluster.requests[-2].fault == "500" and cluster.requests[-2].status == 500
    cluster.faults.off()
    assert core.list_namespaced_config_map("default").items
    assert [r.status for r in cluster.requests.by_verb("list")] == [500, 200]


def test_resource_filter_and_409(cluster, core):
    cluster.faults.configure(rate=1.0, kinds=["409"], resources=["secrets"])
    core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_secret("default", {"metadata": {"name": "s"}})
    assert err.value.status == 409
    assert cluster.get("v1", "Secret", "default", "s") is None  # the fault hit before the store


def test_410_hits_only_watches_as_an_error_event(cluster, core):
    cluster.faults.configure(rate=1.0, kinds=["410"])
    core.list_namespaced_config_map("default")  # not a watch: 410 does not apply
    status, body = raw_get(cluster, "/api/v1/namespaces/default/configmaps?watch=true")
    event = json.loads(body)
    assert status == 200 and event["type"] == "ERROR" and event["object"]["code"] == 410
    assert cluster.faults.injected == {"410": 1}
    cluster.faults.configure(rate=1.0, kinds=["410", "500"])
    with pytest.raises(ApiException):
        core.list_namespaced_config_map("default")  # only 500 is applicable to a list
    assert cluster.faults.injected == {"410": 1, "500": 1}


def test_drop_closes_the_connection(cluster):
    cluster.faults.configure(rate=1.0, kinds=["drop"], verbs=["get"])
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        raw_get(cluster, "/api/v1/namespaces/default/configmaps/a")
    assert cluster.faults.injected == {"drop": 1} and cluster.requests[-1].status is None
    assert raw_get(cluster, "/api/v1/namespaces/default/configmaps")[0] == 200  # the server lives on


def test_slow_delays_and_then_answers(cluster, core):
    cluster.faults.configure(rate=1.0, kinds=["slow"], delay_s=0.3)
    started = time.monotonic()
    core.list_namespaced_config_map("default")
    assert time.monotonic() - started >= 0.3 and cluster.faults.injected == {"slow": 1}


def test_rate_is_deterministic_per_seed(cluster, core):
    def run(seed: int) -> list[bool]:
        cluster.faults.configure(rate=0.5, kinds=["500"], seed=seed)
        outcomes = []
        for _ in range(20):
            try:
                core.list_namespaced_config_map("default")
                outcomes.append(True)
            except ApiException:
                outcomes.append(False)
        return outcomes

    first, again = run(7), run(7)
    assert first == again and 0 < first.count(False) < 20


def test_discovery_and_direct_api_never_fault(cluster, core):
    cluster.faults.configure(rate=1.0, kinds=["500"])
    assert raw_get(cluster, "/api/v1")[0] == 200
    cluster.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "default"}}
    )
    assert cluster.get("v1", "ConfigMap", "default", "a") is not None
    assert cluster.faults.injected == {}


def test_invalid_configuration_is_rejected(cluster):
    with pytest.raises(ValueError):
        cluster.faults.configure(rate=1.0, kinds=["teapot"])
    with pytest.raises(ValueError):
        cluster.faults.configure(rate=2.0)

"""Lists and watches: resourceVersion resumption, selectors, initial events, 410, broken streams."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse

import kubernetes
import pytest

from pd_operator.devcluster import DevCluster, store

pytestmark = pytest.mark.integration


def watch_lines(cluster: DevCluster, path: str, count: int, **params: str) -> list[dict]:
    """Read `count` events of a raw watch stream (or fewer if the server ends it)."""
    host, port = urllib.parse.urlparse(cluster.url).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", f"{path}?{urllib.parse.urlencode({'watch': 'true', **params})}")
    response = conn.getresponse()
    events = []
    while len(events) < count and (line := response.readline()):
        events.append(json.loads(line))
    conn.close()
    return events


def configmap(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


def test_list_carries_resource_version(core):
    core.create_namespaced_config_map("default", configmap("a"))
    listed = core.list_namespaced_config_map("default")
    assert (
        listed.metadata.resource_version
        == core.read_namespaced_config_map("a", "default").metadata.resource_version
    )


def test_label_selectors(core):
    for name, labels in [("a", {"tier": "web", "env": "prod"}), ("b", {"tier": "db"}), ("c", {})]:
        core.create_namespaced_config_map("default", configmap(name, **labels))

    def names(selector: str) -> list[str]:
        return [
            cm.metadata.name
            for cm in core.list_namespaced_config_map("default", label_selector=selector).items
        ]

    assert names("tier=web") == ["a"]
    assert names("tier==web") == ["a"]
    assert names("tier!=web") == ["b", "c"]
    assert names("tier in (web, db)") == ["a", "b"]
    assert names("tier notin (web)") == ["b", "c"]
    assert names("tier") == ["a", "b"]
    assert names("!tier") == ["c"]
    assert names("tier,env=prod") == ["a"]


def test_field_selectors(core):
    core.create_namespaced_config_map("default", configmap("a"))
    core.create_namespaced_config_map("other", configmap("a"))
    core.create_namespaced_config_map("other", configmap("b"))
    items = core.list_config_map_for_all_namespaces(field_selector="metadata.name=a").items
    assert sorted(cm.metadata.namespace for cm in items) == ["default", "other"]
    items = core.list_config_map_for_all_namespaces(
        field_selector="metadata.namespace=other,metadata.name!=a"
    ).items
    assert [cm.metadata.name for cm in items] == ["b"]
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.list_namespaced_config_map("default", field_selector="data.x=1")
    assert err.value.status == 400


def test_watch_without_resource_version_starts_with_current_state(cluster, core):
    core.create_namespaced_config_map("default", configmap("a"))
    events = watch_lines(cluster, "/api/v1/namespaces/default/configmaps", 1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


def test_watch_from_resource_version_sends_only_later_events(cluster, core):
    core.create_namespaced_config_map("default", configmap("a"))
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", configmap("b"))
    core.patch_namespaced_config_map("a", "default", {"data": {"x": "1"}})
    core.delete_namespaced_config_map("b", "default")
    core.create_namespaced_config_map("other", configmap("elsewhere"))
    events = watch_lines(cluster, "/api/v1/namespaces/default/configmaps", 3, resourceVersion=rv)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)


def test_official_client_watch_sees_live_events(api, core):
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    threading.Timer(0.2, core.create_namespaced_config_map, ("default", configmap("live"))).start()
    watch = kubernetes.watch.Watch()
    for event in watch.stream(
        core.list_namespaced_config_map,
        "default",
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    ):
        assert (event["type"], event["object"].metadata.name) == ("ADDED", "live")
        watch.stop()


def test_watch_with_label_selector_reports_entering_and_leaving(cluster, core):
    core.create_namespaced_config_map("default", configmap("a", tier="db"))
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    core.patch_namespaced_config_map("a", "default", {"metadata": {"labels": {"tier": "web"}}})
    core.patch_namespaced_config_map("a", "default", {"data": {"x": "1"}})
    core.patch_namespaced_config_map("a", "default", {"metadata": {"labels": {"tier": "db"}}})
    core.create_namespaced_config_map("default", configmap("b", tier="db"))
    events = watch_lines(
        cluster, "/api/v1/namespaces/default/configmaps", 3, resourceVersion=rv, labelSelector="tier=web"
    )
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]


def test_send_initial_events_ends_with_a_bookmark(cluster, core):
    core.create_namespaced_config_map("default", configmap("a"))
    events = watch_lines(
        cluster,
        "/api/v1/namespaces/default/configmaps",
        2,
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
    )
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_compacted_resource_version_is_an_in_stream_410(monkeypatch):
    monkeypatch.setattr(store, "HISTORY", 2)
    with DevCluster() as cluster:
        for name in "abcd":
            cluster.create(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}}
            )
        events = watch_lines(cluster, "/api/v1/namespaces/default/configmaps", 2, resourceVersion="1")
        assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]


def test_break_watches_ends_open_streams(cluster):
    result: list[list[dict]] = []
    reader = threading.Thread(
        target=lambda: result.append(
            watch_lines(cluster, "/api/v1/namespaces/default/configmaps", 10, resourceVersion="1")
        )
    )
    reader.start()
    while cluster.break_watches() == 0:  # until the reader's stream is open
        time.sleep(0.01)
    reader.join(timeout=5)
    assert not reader.is_alive() and result == [[]]


def test_watch_timeout_seconds_ends_the_stream(cluster):
    assert (
        watch_lines(
            cluster, "/api/v1/namespaces/default/configmaps", 5, resourceVersion="1", timeoutSeconds="0.2"
        )
        == []
    )

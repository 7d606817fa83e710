"""Object semantics over HTTP with the official client: codes, versions, generation, status, patches."""

from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

W = ("test.pd.dev", "v1", "default", "widgets")


def test_create_answers_201_and_sets_metadata(cluster, core):
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}, "data": {"k": "v"}})
    assert cluster.requests[-1].method == "POST" and cluster.requests[-1].status == 201
    assert cm.metadata.uid and cm.metadata.generation == 1 and cm.metadata.creation_timestamp
    assert int(cm.metadata.resource_version) > 0


def test_duplicate_create_is_409_already_exists(core):
    core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"


def test_get_missing_is_404_status(core):
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("nope", "default")
    body = json.loads(err.value.body)
    assert err.value.status == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"


def test_create_in_missing_namespace_is_404(core):
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("ghost", {"metadata": {"name": "a"}})
    assert err.value.status == 404


def test_generate_name(core):
    cm = core.create_namespaced_config_map("default", {"metadata": {"generateName": "gen-"}})
    assert cm.metadata.name.startswith("gen-") and len(cm.metadata.name) == 9


def test_resource_version_is_global_and_bumped_per_change(core):
    a = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    b = core.create_namespaced_config_map("default", {"metadata": {"name": "b"}})
    assert int(b.metadata.resource_version) == int(a.metadata.resource_version) + 1
    a2 = core.patch_namespaced_config_map("a", "default", {"data": {"x": "1"}})
    assert int(a2.metadata.resource_version) == int(b.metadata.resource_version) + 1
    a3 = core.patch_namespaced_config_map("a", "default", {"data": {"x": "1"}})  # no-op
    assert a3.metadata.resource_version == a2.metadata.resource_version


def test_put_replaces_with_optimistic_concurrency(core):
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}, "data": {"k": "v"}})
    stale = cm.metadata.resource_version
    cm.data = {"other": "1"}
    replaced = core.replace_namespaced_config_map("a", "default", cm)
    assert replaced.data == {"other": "1"} and replaced.metadata.resource_version != stale
    cm.metadata.resource_version = stale
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("a", "default", cm)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("missing", "default", {"metadata": {"name": "missing"}})
    assert err.value.status == 404


def test_generation_bumps_on_spec_only(cluster, custom, widget):
    created = custom.create_namespaced_custom_object(*W, widget("w"))
    assert created["metadata"]["generation"] == 1
    spec = custom.patch_namespaced_custom_object(*W, "w", {"spec": {"size": 2}})
    assert spec["metadata"]["generation"] == 2
    meta = custom.patch_namespaced_custom_object(*W, "w", {"metadata": {"labels": {"a": "b"}}})
    assert meta["metadata"]["generation"] == 2
    status = custom.patch_namespaced_custom_object_status(*W, "w", {"status": {"phase": "Ready"}})
    assert status["metadata"]["generation"] == 2
    assert int(status["metadata"]["resourceVersion"]) > int(meta["metadata"]["resourceVersion"])


def test_status_subresource_is_isolated(custom, widget):
    custom.create_namespaced_custom_object(*W, {**widget("w"), "status": {"phase": "Ignored"}})
    body = custom.get_namespaced_custom_object(*W, "w")
    assert "status" not in body  # dropped on create
    custom.patch_namespaced_custom_object_status(*W, "w", {"status": {"phase": "Ready"}, "spec": {"size": 9}})
    custom.patch_namespaced_custom_object(*W, "w", {"status": {"phase": "Hacked"}, "spec": {"size": 3}})
    body = custom.get_namespaced_custom_object(*W, "w")
    assert body["status"] == {"phase": "Ready"} and body["spec"] == {"size": 3}
    body["status"] = {"phase": "Replaced"}
    custom.replace_namespaced_custom_object_status(*W, "w", body)
    assert custom.get_namespaced_custom_object_status(*W, "w")["status"] == {"phase": "Replaced"}


def test_builtin_status_isolated_for_deployment(apps):
    deploy = {
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}},
        },
    }
    apps.create_namespaced_deployment("default", deploy)
    apps.patch_namespaced_deployment("d", "default", {"status": {"replicas": 5}})
    assert apps.read_namespaced_deployment("d", "default").status is None
    apps.patch_namespaced_deployment_status("d", "default", {"status": {"replicas": 5}})
    assert apps.read_namespaced_deployment_status("d", "default").status.replicas == 5


def test_strategic_merge_merges_containers_by_name(apps):
    deploy = {
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {
                    "containers": [
                        {"name": "app", "image": "x:1", "env": [{"name": "A", "value": "1"}]},
                        {"name": "side", "image": "s:1"},
                    ]
                },
            },
        },
    }
    apps.create_namespaced_deployment("default", deploy)
    patch = {
        "spec": {
            "template": {"spec": {"containers": [{"name": "app", "env": [{"name": "B", "value": "2"}]}]}}
        }
    }
    patched = apps.patch_namespaced_deployment("d", "default", patch)  # the client sends strategic merge
    containers = patched.spec.template.spec.containers
    assert [c.name for c in containers] == ["app", "side"]
    assert containers[0].image == "x:1" and [e.name for e in containers[0].env] == ["A", "B"]
    assert patched.metadata.generation == 2


def test_json_patch_with_failing_test_is_422(custom, widget):
    created = custom.create_namespaced_custom_object(*W, widget("w"))
    ok = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": created["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/spec/size", "value": 5},
    ]
    kind = "application/json-patch+json"
    assert custom.patch_namespaced_custom_object(*W, "w", ok, _content_type=kind)["spec"]["size"] == 5
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(*W, "w", ok, _content_type=kind)  # stale resourceVersion now
    assert err.value.status == 422


def test_server_side_apply_creates_then_merges(cluster, core):
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "a", "labels": {"x": "1"}},
        "data": {"one": "1"},
    }
    created = core.patch_namespaced_config_map(
        "a", "default", manifest, field_manager="pd-operator", _content_type="application/apply-patch+yaml"
    )
    assert cluster.requests[-1].status == 201 and created.data == {"one": "1"}
    core.patch_namespaced_config_map("a", "default", {"data": {"two": "2"}})
    manifest["data"] = {"one": "uno"}
    applied = core.patch_namespaced_config_map(
        "a",
        "default",
        manifest,
        field_manager="pd-operator",
        force=True,
        _content_type="application/apply-patch+yaml",
    )
    assert cluster.requests[-1].status == 200
    assert applied.data == {"one": "uno", "two": "2"} and applied.metadata.labels == {"x": "1"}
    assert [(m.manager, m.operation) for m in applied.metadata.managed_fields] == [("pd-operator", "Apply")]


def test_finalizers_delay_deletion(core):
    core.create_namespaced_config_map("default", {"metadata": {"name": "a", "finalizers": ["x/y"]}})
    core.delete_namespaced_config_map("a", "default")
    marked = core.read_namespaced_config_map("a", "default")
    assert marked.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map(
        "a", "default", {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json"
    )
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("a", "default")
    assert err.value.status == 404


def test_owner_deletion_cascades_recursively(cluster, core, custom, widget):
    owner = custom.create_namespaced_custom_object(*W, widget("w"))

    def ref(obj, kind, api_version):
        return [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": obj["metadata"]["name"],
                "uid": obj["metadata"]["uid"],
            }
        ]

    child = core.create_namespaced_config_map(
        "default", {"metadata": {"name": "child", "ownerReferences": ref(owner, "Widget", "test.pd.dev/v1")}}
    ).to_dict()
    grandchild_owner = {"metadata": {"name": child["metadata"]["name"], "uid": child["metadata"]["uid"]}}
    core.create_namespaced_secret(
        "default",
        {"metadata": {"name": "grandchild", "ownerReferences": ref(grandchild_owner, "ConfigMap", "v1")}},
    )
    core.create_namespaced_config_map("default", {"metadata": {"name": "bystander"}})
    cluster.delete("test.pd.dev/v1", "Widget", "default", "w")
    assert cluster.get("v1", "ConfigMap", "default", "child") is None
    assert cluster.get("v1", "Secret", "default", "grandchild") is None
    assert cluster.get("v1", "ConfigMap", "default", "bystander") is not None


def test_orphan_propagation_keeps_dependents(cluster, core, custom, widget):
    owner = custom.create_namespaced_custom_object(*W, widget("w"))
    core.create_namespaced_config_map(
        "default",
        {
            "metadata": {
                "name": "child",
                "ownerReferences": [
                    {
                        "apiVersion": "test.pd.dev/v1",
                        "kind": "Widget",
                        "name": "w",
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            }
        },
    )
    custom.delete_namespaced_custom_object(*W, "w", propagation_policy="Orphan")
    assert core.read_namespaced_config_map("child", "default").metadata.owner_references is None


def test_namespaces_list_get_and_delete(core):
    assert {ns.metadata.name for ns in core.list_namespace().items} == {"default", "other"}
    assert core.read_namespace("default").status.phase == "Active"
    core.create_namespaced_config_map("other", {"metadata": {"name": "a"}})
    core.delete_namespace("other")
    assert core.list_namespaced_config_map("other").items == []


def test_events_can_be_posted(core):
    event = {
        "metadata": {"generateName": "x-"},
        "involvedObject": {"kind": "Widget", "name": "w"},
        "reason": "Testing",
        "message": "hello",
        "type": "Normal",
    }
    core.create_namespaced_event("default", event)
    assert [e.reason for e in core.list_namespaced_event("default").items] == ["Testing"]


def test_delete_collection_by_label(core):
    for name, tier in [("a", "web"), ("b", "web"), ("c", "db")]:
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": {"tier": tier}}})
    core.delete_collection_namespaced_config_map("default", label_selector="tier=web")
    assert [cm.metadata.name for cm in core.list_namespaced_config_map("default").items] == ["c"]


def test_direct_store_api(cluster):
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "labels": {"app": "x"}},
            "spec": {},
            "status": {"phase": "Running"},
        }
    )
    assert cluster.get("v1", "Pod", "default", "p")["status"]["phase"] == "Running"  # seeded status kept
    patched = cluster.patch_status("v1", "Pod", "default", "p", {"podIP": "10.0.0.1"})
    assert patched["status"] == {"phase": "Running", "podIP": "10.0.0.1"}
    assert [p["metadata"]["name"] for p in cluster.list("v1", "Pod", label_selector="app=x")] == ["p"]
    assert cluster.list("v1", "Pod", "other") == []
    cluster.delete("v1", "Pod", "default", "p")
    assert cluster.get("v1", "Pod", "default", "p") is None
    assert cluster.requests.count_writes() == 0  # nothing went over HTTP


def test_crd_posted_over_http_is_served(api, custom, widget_crd):
    crd = {**widget_crd, "metadata": {"name": "gadgets.test.pd.dev"}}
    crd["spec"] = {**crd["spec"], "scope": "Cluster", "names": {"plural": "gadgets", "kind": "Gadget"}}
    kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    gadget = {"apiVersion": "test.pd.dev/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {}}
    created = custom.create_cluster_custom_object("test.pd.dev", "v1", "gadgets", gadget)
    assert created["metadata"]["uid"] and "namespace" not in created["metadata"]
    kubernetes.client.ApiextensionsV1Api(api).delete_custom_resource_definition("gadgets.test.pd.dev")
    with pytest.raises(ApiException) as err:
        custom.list_cluster_custom_object("test.pd.dev", "v1", "gadgets")
    assert err.value.status == 404

"""Discovery as the official client, kopf and kubectl read it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import kubernetes
import pytest

pytestmark = pytest.mark.integration

EXPECTED = {
    "v1": {"Pod", "Service", "ConfigMap", "Secret", "Event", "Namespace"},
    "apps/v1": {"Deployment", "StatefulSet"},
    "networking.k8s.io/v1": {"NetworkPolicy"},
    "policy/v1": {"PodDisruptionBudget"},
    "coordination.k8s.io/v1": {"Lease"},
    "events.k8s.io/v1": {"Event"},
    "admissionregistration.k8s.io/v1": {"ValidatingWebhookConfiguration"},
}


def get_json(cluster, path):
    with urllib.request.urlopen(cluster.url + path) as response:
        return json.load(response)


def resources(cluster, group_version):
    return get_json(cluster, "/api/v1" if group_version == "v1" else f"/apis/{group_version}")


def test_core_and_groups(api):
    core = kubernetes.client.CoreApi(api).get_api_versions()
    assert core.versions == ["v1"]
    groups = {
        g.name: g.preferred_version.group_version
        for g in kubernetes.client.ApisApi(api).get_api_versions().groups
    }
    for group_version in EXPECTED:
        if "/" in group_version:
            assert groups[group_version.split("/")[0]] == group_version
    assert groups["test.pd.dev"] == "test.pd.dev/v1"


@pytest.mark.parametrize("group_version", sorted(EXPECTED))
def test_builtin_resource_lists(cluster, group_version):
    listing = resources(cluster, group_version)
    assert listing["groupVersion"] == group_version
    kinds = {r["kind"] for r in listing["resources"] if "/" not in r["name"]}
    assert EXPECTED[group_version] <= kinds
    names = {r["name"] for r in listing["resources"]}
    if group_version == "apps/v1":
        assert {"deployments/status", "statefulsets/status"} <= names


def test_crd_resource_list(cluster):
    listing = resources(cluster, "test.pd.dev/v1")
    widgets = {r["name"]: r for r in listing["resources"]}
    assert widgets["widgets"]["namespaced"] is True
    assert widgets["widgets"]["shortNames"] == ["wd"] and widgets["widgets"]["categories"] == ["all"]
    assert widgets["widgets"]["singularName"] == "widget" and widgets["widgets/status"]["kind"] == "Widget"


def test_crd_object_is_established(api):
    crd = kubernetes.client.ApiextensionsV1Api(api).read_custom_resource_definition("widgets.test.pd.dev")
    assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"


def test_unknown_group_is_404(cluster):
    with pytest.raises(urllib.error.HTTPError) as err:
        get_json(cluster, "/apis/nope.dev/v1")
    assert err.value.code == 404

"""The attack: an author who may create PDDeployments (and nothing else) in a namespace names one after
objects that already live there, so that the operator, applying its children by name, rewrites them
(a Role's rules, a RoleBinding's subjects, a ConfigMap's data) and, through the owner reference that
apply adds, deletes them when the PDDeployment is deleted.

On the real control plane, with the operator installed by the chart: a ServiceAccount, a Role, a
RoleBinding and a ConfigMap (named as its immutable prefill revision config) named as the GLM
example's children exist before it is applied. They keep their content and their (absent) owners
while the PDDeployment runs and after it is deleted; its status names each of them
(Degraded=True/NameConflict, with an event); its other children are
created and garbage-collected as usual."""

from __future__ import annotations

import pytest

from pd_operator.names import Names
from pd_operator.render import workloads
from support.cluster import wait_for
from support.installed import condition, get_pdd
from support.kube import kubectl
from support.pdd_cluster import GLM, apply, events, glm, wait_cond
from support.specs import resolve

pytestmark = [pytest.mark.security, pytest.mark.integration]

RBAC = "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/{plural}"
CORE = "/api/v1/namespaces/{ns}/{plural}"


def planted(namespace: str) -> list[tuple[str, dict]]:
    """(collection path, object): what the namespace held before the PDDeployment came."""
    names = Names(GLM, namespace)
    labels = {"team": "platform"}
    prefill_config = workloads.templates(resolve(glm(namespace))).configs["prefill"]["metadata"]["name"]
    return [
        (CORE.format(ns=namespace, plural="serviceaccounts"),
         {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": {"name": names.proxy_access, "labels": labels}}),
        (RBAC.format(ns=namespace, plural="roles"),
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
          "metadata": {"name": names.proxy_access, "labels": labels},
          "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["platform-ca"],
                     "verbs": ["get"]}]}),
        (RBAC.format(ns=namespace, plural="rolebindings"),
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
          "metadata": {"name": names.proxy_access, "labels": labels},
          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.proxy_access},
          "subjects": [{"kind": "User", "name": "platform-admin", "apiGroup": "rbac.authorization.k8s.io"}]}),
        (CORE.format(ns=namespace, plural="configmaps"),
         {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": prefill_config, "labels": labels},
          "data": {"settings": "owned by the platform team"}}),
    ]


CONTENT = ("rules", "roleRef", "subjects", "data")


def content(obj: dict) -> dict:
    meta = obj["metadata"]
    return {"uid": meta["uid"], "labels": meta.get("labels"), "owners": meta.get("ownerReferences"),
            "annotations": meta.get("annotations"), **{k: obj.get(k) for k in CONTENT}}


def test_objects_named_as_children_keep_their_content_and_owners(control_plane, namespace, release,
                                                                  start_operator):
    cp = control_plane
    before = {}
    for collection, obj in planted(namespace):
        created = cp.api("POST", collection, obj)
        before[f"{collection}/{obj['metadata']['name']}"] = content(created)
    start_operator("--drift-interval=1")
    apply(cp, glm(namespace))
    wait_for("the StatefulSets", lambda: len(cp.api(
        "GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets")["items"]) >= 2, 120)
    wait_cond(cp, namespace, "Degraded", ("True", "NameConflict"))
    message = condition(get_pdd(cp, namespace, GLM), "Degraded")["message"]
    for _, obj in planted(namespace):
        assert f"{obj['kind']} {obj['metadata']['name']}" in message, message
    wait_for("a NameConflict event", lambda: events(cp, namespace, "NameConflict"), 30)
    described = kubectl(cp.kubeconfig, "describe", "pddeployment", GLM, "-n", namespace).stdout
    assert "NameConflict" in described and f"Role {Names(GLM, namespace).proxy_access}" in described

    def unchanged() -> None:
        for path, was in before.items():
            assert content(cp.api("GET", path)) == was, path
    unchanged()

    cp.api("DELETE", f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/pddeployments/{GLM}")
    # The garbage collector deletes what the PDDeployment owned...
    wait_for("its StatefulSets collected", lambda: not cp.api(
        "GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets")["items"], 120)
    unchanged()  # ...and nothing it did not own

"""Who may create a PDDeployment, as the real kube-apiserver v1.36.3 authorizes it, with the chart
installed and kube-controller-manager's clusterrole-aggregation controller running (the test
cluster runs every controller but nodeipam): the chart's `<release>-edit` and `<release>-view`
ClusterRoles reach Kubernetes' own `edit`, `admin` and `view`, so a namespace's editor may create
PDDeployments there and scale their PDRoles, and nothing more of the operator's objects; its viewer
reads them and creates none; neither reaches another namespace. The attacks are the requests: a
viewer creating a PDDeployment, an editor rewriting a PDRole or a PDDeployment's status (what the
operator writes), an editor of one namespace creating in another. Each is asked of the API server's
own authorizer (SubjectAccessReview)."""

from __future__ import annotations

import pytest

from support.cluster import wait_for

pytestmark = [pytest.mark.security, pytest.mark.integration]

GROUP = "pd.serving.dev"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
EDITOR, VIEWER = "team-editor", "team-viewer"


def grants(cp, cluster_role: str) -> set[tuple[str, str]]:
    """(resource, verb) of pd.serving.dev that a ClusterRole holds, aggregated rules included."""
    role = cp.api("GET", f"{RBAC}/clusterroles/{cluster_role}")
    return {(resource, verb) for rule in role.get("rules") or [] if GROUP in rule.get("apiGroups", [])
            for resource in rule.get("resources", []) for verb in rule.get("verbs", [])}


def allowed(cp, user: str, namespace: str, verb: str, resource: str, subresource: str = "") -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:authenticated"],
                       "resourceAttributes": {"namespace": namespace, "verb": verb, "group": GROUP,
                                              "resource": resource, "subresource": subresource}}}
    return bool(cp.api("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"]
                .get("allowed"))


def bind(cp, namespace: str, user: str, cluster_role: str) -> None:
    cp.api("POST", f"{RBAC}/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{user}-{cluster_role}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})


def test_namespace_editors_may_create_pddeployments_and_nothing_more_of_the_operators(
        control_plane, release, namespace):
    cp = control_plane
    chart_roles = {d["metadata"]["name"] for d in release.find("ClusterRole")
                   if d["metadata"]["name"].endswith(("-edit", "-view"))}
    assert len(chart_roles) == 2, chart_roles
    # The aggregation controller copies the chart's rules into the built-in roles.
    for built_in in ("edit", "admin"):
        wait_for(f"pddeployments in {built_in}",
                 lambda b=built_in: ("pddeployments", "create") in grants(cp, b), 60)
    wait_for("pddeployments in view", lambda: ("pddeployments", "get") in grants(cp, "view"), 60)
    assert ("pddeployments", "create") not in grants(cp, "view")

    bind(cp, namespace, EDITOR, "edit")
    bind(cp, namespace, VIEWER, "view")
    # The authorizer sees a new binding through its informer: wait for both before asking more.
    wait_for("the editor's binding", lambda: allowed(cp, EDITOR, namespace, "create", "pddeployments"), 30)
    wait_for("the viewer's binding", lambda: allowed(cp, VIEWER, namespace, "get", "pddeployments"), 30)
    assert allowed(cp, EDITOR, namespace, "delete", "pddeployments")
    assert allowed(cp, EDITOR, namespace, "patch", "pdroles", "scale")  # kubectl scale pdrole
    assert allowed(cp, VIEWER, namespace, "list", "pdroles")

    # The attacks: each request is refused by the API server's authorizer.
    attacks = [(VIEWER, namespace, "create", "pddeployments", ""),
               (VIEWER, namespace, "patch", "pdroles", "scale"),
               (EDITOR, namespace, "patch", "pdroles", ""),            # the PDRole is the operator's
               (EDITOR, namespace, "create", "pdroles", ""),
               (EDITOR, namespace, "patch", "pddeployments", "status"),  # the status is the operator's
               (EDITOR, namespace, "patch", "pdroles", "status"),
               (EDITOR, "default", "create", "pddeployments", "")]    # another namespace
    assert [a for a in attacks if allowed(cp, *a)] == []

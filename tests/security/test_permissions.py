"""The operator's permissions, as rbac.RULES and as the chart renders them for every value set:
no Secrets, no wildcards, no escalation verbs or pod shells, no binding to a built-in admin role."""

from __future__ import annotations

import pytest

from pd_operator.controller.permissions import RULES
from support.helm_chart import VALUE_SETS, rendered, template_with

ROLE_KINDS = ("ClusterRole", "Role")
BINDING_KINDS = ("ClusterRoleBinding", "RoleBinding")
BUILT_IN_ADMIN = {"cluster-admin", "admin", "edit", "system:masters"}
# Verbs that grant more than the named access: creating bindings/roles with more rights than held,
# acting as another user.
ESCALATING_VERBS = {"escalate", "bind", "impersonate"}
# Subresources that give a shell or a tunnel into a serving pod.
POD_ACCESS = {"pods/exec", "pods/attach", "pods/portforward", "pods/proxy", "nodes/proxy"}


def rule_problems(rules: list[dict]) -> list[str]:
    out = []
    for i, rule in enumerate(rules):
        groups, resources, verbs = rule.get("apiGroups", []), rule.get("resources", []), rule.get("verbs", [])
        for field, values in (("apiGroups", groups), ("resources", resources), ("verbs", verbs)):
            if "*" in values or any(v.endswith("/*") for v in values):
                out.append(f"rule {i}: {field} has a wildcard")
        if any(r.split("/")[0] == "secrets" for r in resources):
            out.append(f"rule {i}: grants access to Secrets")
        if ESCALATING_VERBS & set(verbs):
            out.append(f"rule {i}: escalation verbs {sorted(ESCALATING_VERBS & set(verbs))}")
        if POD_ACCESS & set(resources):
            out.append(f"rule {i}: pod access {sorted(POD_ACCESS & set(resources))}")
        if rule.get("nonResourceURLs"):
            out.append(f"rule {i}: non-resource URLs")
    return out


def test_the_checker_finds_each_kind_of_problem():
    bad = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
           {"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]},
           {"apiGroups": ["apps"], "resources": ["*"], "verbs": ["get"]},
           {"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]},
           {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"]},
           {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}]
    assert len(rule_problems(bad)) == len(bad)


def test_rbac_rules_are_narrow():
    assert rule_problems(RULES) == []


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_chart_roles_are_narrow(value_set):
    docs = rendered(value_set)
    roles = [d for d in docs if d["kind"] in ROLE_KINDS]
    assert roles, f"{value_set}: the chart renders no Role or ClusterRole"
    for role in roles:
        assert "aggregationRule" not in role, f"{role['metadata']['name']} aggregates other roles"
        assert rule_problems(role["rules"]) == [], f"{value_set}: {role['kind']} {role['metadata']['name']}"


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_chart_binds_only_its_own_roles(value_set):
    docs = rendered(value_set)
    own = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ROLE_KINDS}
    bindings = [d for d in docs if d["kind"] in BINDING_KINDS]
    assert bindings
    for binding in bindings:
        ref = binding["roleRef"]
        assert ref["name"] not in BUILT_IN_ADMIN, f"{binding['metadata']['name']} binds {ref['name']}"
        assert (ref["kind"], ref["name"]) in own, f"{binding['metadata']['name']} binds a foreign role"
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount", subject
            assert subject["name"] not in ("default",), "binds the namespace's default ServiceAccount"


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_operator_pod_is_hardened(value_set):
    docs = rendered(value_set)
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        pod = d["spec"]["template"]["spec"]
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        for c in pod["containers"]:
            ctx = c.get("securityContext", {})
            assert ctx.get("privileged") is not True, c["name"]
            assert ctx.get("allowPrivilegeEscalation") is False, c["name"]
            caps = ctx.get("capabilities", {})
            assert not caps.get("add"), c["name"]
            assert "ALL" in caps.get("drop", []), c["name"]
            assert ctx.get("runAsNonRoot") or pod.get("securityContext", {}).get("runAsNonRoot"), c["name"]


def test_the_user_roles_grant_pddeployments_and_scaling_only_aggregated_into_the_built_in_ones():
    """Who may edit a namespace may create its PDDeployments and scale its PDRoles; who may view it
    may read both; nothing of the operator's children (docs/security.md)."""
    docs = rendered("default")
    cluster_roles = [d for d in docs if d["kind"] == "ClusterRole"]
    roles = {d["metadata"]["name"].rsplit("-", 1)[1]: d for d in cluster_roles
             if d["metadata"]["name"] in ("pdo-pd-operator-edit", "pdo-pd-operator-view")}
    assert set(roles) == {"edit", "view"} and len(cluster_roles) == 3  # and the operator's own
    labels = {name: {k.rsplit("/", 1)[1] for k, v in role["metadata"]["labels"].items()
                     if k.startswith("rbac.authorization.k8s.io/aggregate-to-") and v == "true"}
              for name, role in roles.items()}
    assert labels == {"edit": {"aggregate-to-edit", "aggregate-to-admin"}, "view": {"aggregate-to-view"}}
    granted = {name: {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
                      for r in rule["resources"] for v in rule["verbs"]} for name, role in roles.items()}
    assert {g for g, _, _ in granted["edit"] | granted["view"]} == {"pd.serving.dev"}
    assert {r for _, r, v in granted["edit"] if v not in ("get", "list", "watch")} == {
        "pddeployments", "pdroles/scale"}
    assert {v for _, _, v in granted["view"]} == {"get", "list", "watch"}
    for role in roles.values():
        assert rule_problems(role["rules"]) == []
    assert not [d for d in template_with("rbac.userRoles=false") if d["kind"] == "ClusterRole"
                and d["metadata"]["name"].endswith(("-edit", "-view"))]

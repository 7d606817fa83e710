"""The chart's generated copies match their sources, and the rendered RBAC grants exactly
pd_operator.controller.permissions.RULES (plus kopf's framework rules) in the right scope for each mode."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pd_operator.controller.permissions import RULES, WEBHOOK_RULES
from pd_operator.spec.host_paths import DEFAULT as DEFAULT_HOST_PATHS
from pd_operator.tools import chart_sync
from support.helm_chart import CHART, REPO, find, one, rendered, run_helm

# (apiGroup, resource, verb) triples kopf itself needs, by mode; nothing else may be granted.
CRD_READ = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")}
NAMESPACE_READ = {("", "namespaces", v) for v in ("get", "list", "watch")}
# The self-signed webhook: patch this release's configuration (rbac.WEBHOOK_RULES).
WEBHOOK_CONFIG = {("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch")}
PEERING = ("get", "list", "watch", "patch")
OPERATOR_ROLE = "pdo-pd-operator"
"""The operator's own ClusterRole (the release's full name); the users' roles are beside it."""


def _triples(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


OPERATOR = _triples(RULES)


def test_chart_crds_equal_the_generated_crds():
    sources = sorted((REPO / "crds").glob("*.yaml"))
    assert sources, "crds/ is empty: run `make crds`"
    for source in sources:
        copy = CHART / "crds" / source.name
        assert copy.exists(), f"{copy} missing: run `make chart-sync`"
        assert copy.read_text() == source.read_text(), f"{copy} is stale: run `make chart-sync`"
    chart_files = {p.name for p in (CHART / "crds").glob("*.yaml")}
    assert chart_files == {s.name for s in sources} | chart_sync.CHART_OWNED_CRDS


def test_chart_host_paths_file_is_the_operators_default():
    text = (CHART / "files" / "host-paths.yaml").read_text()
    assert text == chart_sync.host_paths_document()
    assert tuple(yaml.safe_load(text)["allowed"]) == DEFAULT_HOST_PATHS.allowed


def test_chart_rbac_file_equals_the_rules():
    text = (CHART / "files" / "rbac-rules.yaml").read_text()
    assert text == chart_sync.rules_document(RULES), "run `make chart-sync`"
    document = yaml.safe_load(text)
    assert _triples(document["namespaced"] + document["clusterScoped"]) == OPERATOR
    assert _triples(document["selfSignedWebhook"]) == _triples(WEBHOOK_RULES) == WEBHOOK_CONFIG


def test_cluster_mode_grants_the_rules_cluster_wide():
    docs = rendered("default")
    role = one(docs, "ClusterRole", OPERATOR_ROLE)
    assert find(docs, "Role") == [] and find(docs, "RoleBinding") == []
    assert _triples(role["rules"]) == OPERATOR | CRD_READ | WEBHOOK_CONFIG
    (named,) = [r for r in role["rules"] if "resourceNames" in r]
    assert named["verbs"] == ["patch"]
    assert named["resourceNames"] == [one(docs, "ValidatingWebhookConfiguration")["metadata"]["name"]]


def test_no_role_of_the_chart_reads_pod_logs():
    """The operator reads the KV-link gate's result on its probe port (issue 32), so neither its own
    ClusterRole nor a namespaced Role of any value set grants pods/log."""
    for values in ("default", "namespaced"):
        for role in [*find(rendered(values), "ClusterRole"), *find(rendered(values), "Role")]:
            assert not any(resource == "pods/log" for _, resource, _ in _triples(role["rules"])), \
                (values, role["metadata"]["name"])
    assert not any(resource == "pods/log" for _, resource, _ in OPERATOR)


def test_namespaced_mode_grants_the_rules_per_namespace_only():
    docs = rendered("namespaced")
    roles = find(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["llm-prod", "llm-staging"]
    for role in roles:
        assert _triples(role["rules"]) == OPERATOR
    bound = sorted(b["metadata"]["namespace"] for b in find(docs, "RoleBinding"))
    assert bound == ["llm-prod", "llm-staging"]
    # What stays cluster-wide is read-only apart from the webhook configuration the operator fills in.
    operator_role = one(docs, "ClusterRole", OPERATOR_ROLE)
    assert _triples(operator_role["rules"]) == CRD_READ | NAMESPACE_READ | WEBHOOK_CONFIG


def test_no_webhook_means_no_webhook_permission():
    webhook_off = one(rendered("webhook-off"), "ClusterRole", OPERATOR_ROLE)
    assert _triples(webhook_off["rules"]) == OPERATOR | CRD_READ
    # cert-manager injects the CA itself.
    cert_manager = one(rendered("cert-manager"), "ClusterRole", OPERATOR_ROLE)
    assert _triples(cert_manager["rules"]) == OPERATOR | CRD_READ


def test_peering_permissions_follow_the_mode():
    cluster = one(rendered("peering"), "ClusterRole", OPERATOR_ROLE)["rules"]
    cluster_peering = {("kopf.dev", "clusterkopfpeerings", v) for v in PEERING}
    assert _triples(cluster) == OPERATOR | CRD_READ | cluster_peering
    docs = rendered("peering-namespaced")
    (role,) = find(docs, "Role")
    assert _triples(role["rules"]) == OPERATOR | {("kopf.dev", "kopfpeerings", v) for v in PEERING}
    assert _triples(one(docs, "ClusterRole", OPERATOR_ROLE)["rules"]) == CRD_READ | NAMESPACE_READ


# --- the sync tool itself, on a scratch repository ---

def _scratch_repo(tmp_path: Path, crds: dict[str, str]) -> Path:
    (tmp_path / "crds").mkdir()
    for name, text in crds.items():
        (tmp_path / "crds" / name).write_text(text)
    return tmp_path


def test_sync_writes_copies_then_is_idempotent(tmp_path):
    root = _scratch_repo(tmp_path, {"a.yaml": "kind: CustomResourceDefinition\n"})
    changed = chart_sync.sync(root)
    assert {p.relative_to(root).as_posix() for p in changed} == {
        "charts/pd-operator/files/rbac-rules.yaml", "charts/pd-operator/files/host-paths.yaml",
        "charts/pd-operator/crds/a.yaml",
    }
    assert (root / "charts/pd-operator/crds/a.yaml").read_text() == "kind: CustomResourceDefinition\n"
    assert chart_sync.sync(root) == []


def test_sync_removes_a_crd_gone_from_the_source_but_keeps_chart_owned_ones(tmp_path):
    root = _scratch_repo(tmp_path, {"new.yaml": "x: 1\n"})
    chart_crds = root / "charts/pd-operator/crds"
    chart_crds.mkdir(parents=True)
    (chart_crds / "old.yaml").write_text("x: 0\n")
    owned = sorted(chart_sync.CHART_OWNED_CRDS)[0]
    (chart_crds / owned).write_text("kopf\n")
    chart_sync.sync(root)
    assert sorted(p.name for p in chart_crds.glob("*.yaml")) == sorted(["new.yaml", owned])


def test_sync_without_crds_says_what_to_run(tmp_path, capsys):
    assert chart_sync.main(["--root", str(tmp_path)]) == 1
    assert "run `make crds` first" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("rule", "namespaced", "cluster"),
    [
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, ["pods"], []),
        ({"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["get"]},
         [], ["nodes", "nodes/status"]),
        ({"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list"]},
         ["pods"], ["namespaces"]),
    ],
)
def test_rules_split_by_scope(rule, namespaced, cluster):
    split = chart_sync.split_by_scope([rule])
    assert [r for x in split["namespaced"] for r in x["resources"]] == namespaced
    assert [r for x in split["clusterScoped"] for r in x["resources"]] == cluster
    for part in split["namespaced"] + split["clusterScoped"]:
        assert part["verbs"] == rule["verbs"] and part["apiGroups"] == rule["apiGroups"]


def test_cluster_scoped_rules_stay_in_the_cluster_role_in_namespaced_mode(tmp_path):
    # A rule a Role cannot grant (nodes) must still reach the operator when RULES gains one.
    chart = tmp_path / "pd-operator"
    shutil.copytree(CHART, chart)
    rules = [*RULES, {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    (chart / "files" / "rbac-rules.yaml").write_text(chart_sync.rules_document(rules))
    result = run_helm("template", "pdo", str(chart), "--set", "watchNamespaces={llm-prod}")
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    nodes = {("", "nodes", "get"), ("", "nodes", "list")}
    assert nodes <= _triples(one(docs, "ClusterRole", OPERATOR_ROLE)["rules"])
    assert _triples(one(docs, "Role")["rules"]) == OPERATOR

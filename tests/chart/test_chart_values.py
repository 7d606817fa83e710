"""`helm lint --strict` passes for every value set; bad values fail with a message naming the value."""

from __future__ import annotations

import json

import pytest
import yaml

import pd_operator
from support.helm_chart import CHART, NAMESPACE, RELEASE, VALUE_SETS, run_helm, stable, template, values_args

# The modes the lead asked to be covered, each by a file under values/.
REQUIRED_VALUE_SETS = {"namespaced", "cert-manager", "webhook-off", "metrics", "peering"}


def test_every_required_mode_has_a_value_file():
    assert set(VALUE_SETS) >= REQUIRED_VALUE_SETS


def test_helm_lint_strict(value_set):
    result = run_helm("lint", "--strict", str(CHART), *values_args(value_set))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("replicaCount=-1", ["/replicaCount", "minimum", "-1"]),
        ("webhook.failurePolicy=Sometimes", ["/webhook/failurePolicy", "'Fail', 'Ignore'"]),
        ("replicas=2", ["additional properties 'replicas' not allowed"]),
        ("webhook.certManager.enabeld=true", ["/webhook/certManager", "'enabeld' not allowed"]),
        ("watchNamespaces[0]=Team_A", ["/watchNamespaces/0", "'Team_A' does not match"]),
        ("logFormat=xml", ["/logFormat", "'json', 'plain'"]),
        ("webhook.timeoutSeconds=60", ["/webhook/timeoutSeconds", "maximum"]),
        ("securityContext.runAsUser=0", ["/securityContext/runAsUser", "minimum"]),
        ("metrics.serviceMonitor.interval=often", ["/metrics/serviceMonitor/interval", "'often'"]),
        ("resources.limits.memory=lots", ["/resources/limits/memory", "'lots'"]),
    ],
)
def test_schema_rejects_bad_value_naming_it(setting, expected):
    result = template("--set", setting)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    for fragment in expected:
        assert fragment in result.stderr, result.stderr
    assert "panic" not in result.stderr and "goroutine" not in result.stderr


def test_schema_accepts_an_existing_cluster_issuer():
    result = template(
        "--set", "webhook.certManager.enabled=true",
        "--set", "webhook.certManager.issuerRef.name=corp-ca",
        "--set", "webhook.certManager.issuerRef.kind=ClusterIssuer",
    )
    assert result.returncode == 0, result.stderr


def test_self_signed_certificate_with_several_replicas_is_refused():
    # Each replica would mint its own CA while the Service spreads calls over all of them.
    result = template("--set", "replicaCount=2")
    assert result.returncode != 0
    assert "self-signed certificate needs replicaCount 1" in result.stderr
    assert "webhook.certManager.enabled=true" in result.stderr


def _objects_with_properties(node: object, path: str = "") -> list[tuple[str, dict]]:
    if not isinstance(node, dict):
        return []
    found = [(path or "/", node)] if "properties" in node else []
    for key, child in node.items():
        children = child.values() if key in ("properties", "definitions") else [child]
        names = list(child) if key in ("properties", "definitions") else [key]
        for name, sub in zip(names, children, strict=True):
            found += _objects_with_properties(sub, f"{path}/{name}")
    return found


def test_every_schema_object_with_known_keys_is_closed():
    # A misspelt key under any of these must be an error, not silently ignored.
    schema = json.loads((CHART / "values.schema.json").read_text())
    objects = _objects_with_properties(schema)
    assert len(objects) > 10
    open_objects = [path for path, node in objects if node.get("additionalProperties") is not False]
    assert open_objects == []


def test_chart_app_version_is_the_package_version():
    # The image tag defaults to appVersion, so it must name the operator release it packages.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == pd_operator.__version__


def test_operator_ports_must_differ():
    result = template("--set", "metrics.port=8080")
    assert result.returncode != 0
    assert "health.port, metrics.port and webhook.port must differ (got [8080 8080 9443])" in result.stderr
    # The webhook port is free to reuse when there is no webhook listener.
    assert template("--set", "webhook.enabled=false", "--set", "webhook.port=8080").returncode == 0


def test_an_existing_service_account_must_be_named():
    result = template("--set", "serviceAccount.create=false")
    assert result.returncode != 0
    assert "serviceAccount.name is required when serviceAccount.create is false" in result.stderr
    named = template("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops")
    assert named.returncode == 0, named.stderr
    docs = [d for d in yaml.safe_load_all(named.stdout) if d]
    assert not [d for d in docs if d["kind"] == "ServiceAccount"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


def test_the_packaged_chart_renders_like_the_source(tmp_path):
    # .Files.Get and crds/ must survive `helm package` (.helmignore must not drop them).
    packaged = run_helm("package", str(CHART), "-d", str(tmp_path))
    assert packaged.returncode == 0, packaged.stderr
    (archive,) = tmp_path.glob("pd-operator-*.tgz")
    from_archive = run_helm("template", RELEASE, str(archive), "-n", NAMESPACE, "--include-crds")
    from_source = template()
    assert from_archive.returncode == 0, from_archive.stderr
    assert stable(from_archive.stdout) == stable(from_source.stdout)
    assert stable(from_source.stdout) != from_source.stdout  # the key is there, made at render

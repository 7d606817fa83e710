"""Every rendered manifest is valid: built-in kinds against Kubernetes' own schemas (kubernetes-validate
--strict) for 1.33 and the oldest version the chart declares, custom resources against their CRD or a
structural schema."""

from __future__ import annotations

import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from support.helm_chart import CHART, rendered


def _oldest_declared_version() -> str:
    declared = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=(\d+\.\d+)\.0-0", declared)
    assert match, f"Chart.yaml kubeVersion {declared!r} is not of the form >=X.Y.0-0"
    return match.group(1)


TARGET_VERSION = "1.33"
OLDEST_VERSION = _oldest_declared_version()

# Kinds whose CRDs are not part of the chart: the fields the chart sets, with additionalProperties
# false so a misspelt field fails (cert-manager.io/v1 and monitoring.coreos.com/v1 API references).
_STR = {"type": "string", "minLength": 1}
_DURATION = {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}


def _closed(properties: dict, *required: str, **extra) -> dict:
    """An object schema that refuses keys it does not list."""
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": list(required), **extra}


def _namespaced_resource(api_version: str, spec: dict) -> dict:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "metadata": {"type": "object", "required": ["name", "namespace"]},
            "spec": spec,
        },
    }


CERT_MANAGER_ISSUER = _namespaced_resource(
    "cert-manager.io/v1",
    _closed({"selfSigned": {"type": "object"}, "ca": {"type": "object"}}, minProperties=1),
)
CERT_MANAGER_CERTIFICATE = _namespaced_resource(
    "cert-manager.io/v1",
    _closed(
        {
            "secretName": _STR,
            "duration": _STR,
            "renewBefore": _STR,
            "dnsNames": {"type": "array", "minItems": 1, "items": _STR},
            "privateKey": _closed({
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                "size": {"type": "integer"},
                "rotationPolicy": {"enum": ["Never", "Always"]},
            }),
            "issuerRef": _closed(
                {"name": _STR, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": _STR}, "name",
            ),
        },
        "secretName", "issuerRef", "dnsNames",
    ),
)
_SCRAPE_ENDPOINT = _closed({"port": _STR, "path": _STR, "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION, "scrapeTimeout": _DURATION}, "port")
"""An endpoint of a ServiceMonitor or a PodMonitor."""
SERVICE_MONITOR = _namespaced_resource(
    "monitoring.coreos.com/v1",
    _closed(
        {
            "selector": _closed({"matchLabels": {"type": "object", "minProperties": 1}}),
            "namespaceSelector": _closed({"matchNames": {"type": "array", "items": _STR}}),
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": _SCRAPE_ENDPOINT,
            },
        },
        "selector", "endpoints",
    ),
)
POD_MONITOR = _namespaced_resource(
    "monitoring.coreos.com/v1",
    _closed(
        {
            "selector": _closed({"matchLabels": {"type": "object", "minProperties": 1}}),
            "namespaceSelector": _closed({"matchNames": {"type": "array", "items": _STR},
                                          "any": {"type": "boolean"}}),
            "podMetricsEndpoints": {
                "type": "array",
                "minItems": 1,
                "items": _SCRAPE_ENDPOINT,
            },
        },
        "selector", "podMetricsEndpoints",
    ),
)
EXTERNAL_KINDS = {
    ("cert-manager.io/v1", "Issuer"): CERT_MANAGER_ISSUER,
    ("cert-manager.io/v1", "Certificate"): CERT_MANAGER_CERTIFICATE,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
}


def _crd_kinds(docs: list[dict]) -> dict[tuple[str, str], tuple[str, dict]]:
    """(apiVersion, kind) -> (scope, openAPIV3Schema) for every CRD rendered with the chart."""
    kinds = {}
    for crd in (d for d in docs if d["kind"] == "CustomResourceDefinition"):
        spec = crd["spec"]
        for version in spec["versions"]:
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            kinds[key] = (spec["scope"], version["schema"]["openAPIV3Schema"])
    return kinds


def _label(doc: dict) -> str:
    return f"{doc['kind']}/{doc['metadata'].get('name')}"


def _validate(doc: dict, crds: dict, version: str = TARGET_VERSION) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in crds:
        scope, schema = crds[key]
        assert ("namespace" in doc["metadata"]) == (scope == "Namespaced"), f"{_label(doc)}: scope {scope}"
        body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
        jsonschema.validate(body, schema)
    elif key in EXTERNAL_KINDS:
        jsonschema.validate(doc, EXTERNAL_KINDS[key])
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", [TARGET_VERSION, OLDEST_VERSION])
def test_every_manifest_is_valid(value_set, version):
    docs = rendered(value_set)
    crds = _crd_kinds(docs)
    failures = []
    for doc in docs:
        try:
            _validate(doc, crds, version)
        except (jsonschema.ValidationError, AssertionError) as err:
            failures.append(f"{_label(doc)}: {getattr(err, 'message', err)}")
        except kubernetes_validate.SchemaNotFoundError as err:
            failures.append(f"{_label(doc)}: {err.message} (no schema to check it against)")
    assert failures == []


def test_validation_catches_a_misspelt_field():
    # The strict built-in schemas really are in force: an unknown container field fails.
    docs = rendered("default")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        _validate(broken, _crd_kinds(docs))


def test_every_manifest_carries_the_standard_labels(value_set):
    for doc in rendered(value_set):
        if doc["kind"] == "CustomResourceDefinition":
            continue  # CRDs come from crds/, outside templating
        labels = doc["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "helm.sh/chart"):
            assert key in labels, f"{_label(doc)} lacks label {key}"


def test_structural_check_catches_a_misspelt_certificate_field():
    docs = rendered("cert-manager")
    certificate = next(d for d in docs if d["kind"] == "Certificate")
    broken = {**certificate, "spec": {**certificate["spec"], "renewbefore": "1h"}}
    with pytest.raises(jsonschema.ValidationError, match="renewbefore"):
        _validate(broken, _crd_kinds(docs))

"""The CRD is generated from the pydantic models and is structural, documented and current."""

from __future__ import annotations

from pathlib import Path

import yaml

from pd_operator.api import crd
from pd_operator.api.types import PDDeploymentSpec

ROOT = Path(__file__).resolve().parents[2]


def _walk(node, path="openAPIV3Schema"):
    yield path, node
    if isinstance(node, dict):
        for key, sub in node.get("properties", {}).items():
            yield from _walk(sub, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_current():
    committed = (ROOT / "crds" / crd.CRD_FILE).read_text()
    assert committed == crd.crd_yaml(), "crds/ is stale: run `make crds` and commit the result"


def test_schema_is_structural():
    schema = crd.openapi_schema()
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "oneOf" not in node, path
        if "properties" in node:
            assert "additionalProperties" not in node, path
        has_type = "type" in node or node.get("x-kubernetes-int-or-string")
        assert has_type, f"{path} has no type"
        assert node.get("type") != "null", path


def test_every_spec_field_is_documented_for_kubectl_explain():
    spec = crd.openapi_schema()["properties"]["spec"]
    undocumented = [p for p, node in _walk(spec, "spec")
                    if "description" not in node and not p.endswith("[]") and "{" not in p
                    and p.count(".") <= 3]
    # Leaf fields whose name says it all may go without; the sections must all be explained.
    sections = [p for p in undocumented if any(p == f"spec.{k}" for k in PDDeploymentSpec.model_fields)]
    assert not sections, sections


def test_names_columns_and_subresources():
    doc = yaml.safe_load((ROOT / "crds" / crd.CRD_FILE).read_text())
    spec = doc["spec"]
    assert spec["group"] == "pd.serving.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["pdd"] and "all" in spec["names"]["categories"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Compatible"] == '.status.conditions[?(@.type=="KVCompatible")].status'
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert {"Prefill", "Decode", "Age"} <= set(columns)


def test_enums_bounds_and_defaults_come_from_the_models():
    spec = crd.openapi_schema()["properties"]["spec"]["properties"]
    kv = spec["kvTransfer"]["properties"]
    assert kv["connector"]["enum"] == ["MooncakeConnectorV2", "MooncakeConnectorV1"]
    assert kv["connector"]["default"] == "MooncakeConnectorV2"
    # vllm-ascend's PD connectors hard-code P2P handshakes and the ascend transport: no choice offered.
    assert "protocol" not in kv and "metadata" not in kv
    timeouts = kv["timeouts"]["properties"]
    assert (timeouts["transferMs"]["default"], timeouts["connectMs"]["default"]) == (10000, 10000)
    mounts = spec["decode"]["properties"]["hostMounts"]["properties"]
    assert mounts["generation"]["enum"] == ["A2", "A3", "A5", "none"]
    tp = spec["decode"]["properties"]["tensorParallelSize"]
    assert (tp["minimum"], tp["maximum"], tp["default"]) == (1, 64, 1)
    assert spec["prefill"]["properties"]["npuResourceName"]["default"] == "huawei.com/Ascend910"


def test_cache_group_union_is_one_object_with_rules_per_kind():
    groups = crd.openapi_schema()["properties"]["spec"]["properties"]["model"]["properties"]["kv"][
        "properties"]["groups"]["items"]
    assert groups["properties"]["kind"]["enum"] == ["attention", "mla", "indexer", "indexerTail", "state"]
    assert not any("default" in p for k, p in groups["properties"].items() if k != "kind")
    messages = [r["message"] for r in groups["x-kubernetes-validations"]]
    assert "kind mla needs kvLoraRank" in messages
    assert "kind indexerTail needs headDim, poolTokens" in messages

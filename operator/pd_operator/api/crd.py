"""Generate the CustomResourceDefinitions (PDDeployment, PDRole) from the pydantic models.

Pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema: no `$ref`, no
`anyOf` around properties, no `additionalProperties` beside `properties`, `nullable` instead of
`null` types, int-or-string as `x-kubernetes-int-or-string`. This module does that conversion and
nothing else, so `make crds` output is a pure function of `api.types`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel

from pd_operator.api.conditions import KV_COMPATIBLE, READY
from pd_operator.api.labels import APP_NAME, MANAGER, PART_OF
from pd_operator.api.types import GROUP, KIND, PLURAL, ROLE_KIND, ROLE_PLURAL, VERSION, PDDeployment, PDRole
from pd_operator.api_model import CEL_RULES

# Keys JSON Schema has that a structural schema does not take.
_DROP = ("title", "discriminator")

PDD_COLUMNS: list[dict] = [
    {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.shape",
     "description": "Prefill instances x data parallel x tensor parallel"},
    {"name": "Decode", "type": "string", "jsonPath": ".status.decode.shape",
     "description": "Decode instances x data parallel x tensor parallel"},
    {"name": "Compatible", "type": "string",
     "jsonPath": f".status.conditions[?(@.type==\"{KV_COMPATIBLE}\")].status",
     "description": "Whether prefill and decode KV layouts are compatible"},
    {"name": "Ready", "type": "string", "jsonPath": f".status.conditions[?(@.type==\"{READY}\")].status"},
    {"name": "Reason", "type": "string", "priority": 1,
     "jsonPath": f".status.conditions[?(@.type==\"{READY}\")].reason"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
PDROLE_COLUMNS: list[dict] = [
    {"name": "Deployment", "type": "string", "jsonPath": ".spec.deployment"},
    {"name": "Role", "type": "string", "jsonPath": ".spec.role"},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas",
     "description": "Instances asked for (kubectl scale, an HPA)"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.replicas",
     "description": "Instances the operator runs: the request held at spec.scaling's bounds"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Up-to-date", "type": "integer", "jsonPath": ".status.updatedReplicas"},
    {"name": "Draining", "type": "integer", "jsonPath": ".status.draining",
     "description": "Removed instances still draining before they are deleted"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


@dataclass(frozen=True)
class Kind:
    """One custom resource: its model and what the CRD says about it besides the schema."""

    model: type[BaseModel]
    kind: str
    plural: str
    short_names: list[str]
    columns: list[dict]
    subresources: dict = field(default_factory=lambda: {"status": {}})

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def file(self) -> str:
        return f"{GROUP}_{self.plural}.yaml"


PDDEPLOYMENT = Kind(PDDeployment, KIND, PLURAL, ["pdd"], PDD_COLUMNS)
# The scale subresource is what `kubectl scale`, HPAs and KEDA use: .spec.replicas is asked, .status
# (replicas, selector) is what the operator runs (k8s.io/apiextensions-apiserver:
# pkg/apis/apiextensions/types.go CustomResourceSubresourceScale @ v0.36.3).
PDROLE = Kind(PDRole, ROLE_KIND, ROLE_PLURAL, ["pdr"], PDROLE_COLUMNS,
              {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                       "statusReplicasPath": ".status.replicas",
                                       "labelSelectorPath": ".status.selector"}})
KINDS = (PDDEPLOYMENT, PDROLE)
CRD_FILE = PDDEPLOYMENT.file


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        target = _resolve(copy.deepcopy(defs[name]), defs)
        extra = {k: v for k, v in node.items() if k != "$ref"}
        if name in CEL_RULES:
            target["x-kubernetes-validations"] = CEL_RULES[name]
        return {**target, **extra}
    return {k: _resolve(v, defs) for k, v in node.items()}


def _merge_variants(variants: list[dict]) -> dict:
    """A discriminated union of objects as one object: all properties, `kind` as an enum, and a
    CEL rule per variant for the fields it requires (structural schemas allow no oneOf here)."""
    merged: dict[str, Any] = {"type": "object", "properties": {}, "description": "One of: " + "; ".join(
        f"kind {v['properties']['kind']['const']}: {v.get('description', '')}" for v in variants)}
    kinds = []
    rules = []
    common = set.intersection(*(set(v.get("required", [])) for v in variants)) | {"kind"}
    for v in variants:
        kind = v["properties"]["kind"]["const"]
        kinds.append(kind)
        for key, prop in v["properties"].items():
            # No defaults on merged fields: the API server would default one variant's field onto
            # another kind (pydantic applies each variant's own defaults instead).
            if key != "kind":
                merged["properties"].setdefault(key, {k: x for k, x in prop.items() if k != "default"})
        needs = [f for f in v.get("required", []) if f not in common]
        allowed = set(v["properties"])
        if needs:
            present = " && ".join(f"has(self.{f})" for f in needs)
            rules.append({"rule": f"self.kind != '{kind}' || ({present})",
                          "message": f"kind {kind} needs {', '.join(needs)}"})
        foreign = sorted(set().union(*(x["properties"] for x in variants)) - allowed)
        if foreign:
            absent = " || ".join(f"has(self.{f})" for f in foreign)
            rules.append({"rule": f"self.kind != '{kind}' || !({absent})",
                          "message": f"kind {kind} does not take {', '.join(foreign)}"})
    merged["properties"]["kind"] = {"type": "string", "enum": kinds}
    merged["required"] = sorted(common)
    merged["x-kubernetes-validations"] = rules
    return merged


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if node.get("x-kubernetes-int-or-string"):
        return {"x-kubernetes-int-or-string": True}
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if not options:
            continue
        non_null = [o for o in options if o.get("type") != "null"]
        del node[key]
        if len(non_null) == 1:
            node = {**non_null[0], **node}
            if node.get("default", 0) is None:
                del node["default"]
        elif all(o.get("type") == "object" and "kind" in o.get("properties", {}) for o in non_null):
            node = {**_merge_variants(non_null), **{k: v for k, v in node.items() if k == "description"}}
        elif {o.get("type") for o in non_null} == {"integer", "string"}:
            described = {k: v for k, v in node.items() if k == "description"}
            node = {"x-kubernetes-int-or-string": True, **described}
        else:
            raise ValueError(f"cannot express this union structurally: {options}")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        node.pop("additionalProperties", None)
    elif isinstance(node.get("additionalProperties"), dict) and "properties" not in node:
        node["additionalProperties"] = _structural(node["additionalProperties"])
    else:
        node.pop("additionalProperties", None)
    for key in _DROP:
        node.pop(key, None)
    if "properties" in node:
        node["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
        node.setdefault("type", "object")
        defaults = {k for k, v in node["properties"].items() if "default" in v}
        if "required" in node:
            node["required"] = [r for r in node["required"] if r not in defaults]
            if not node["required"]:
                del node["required"]
    if "items" in node:
        node["items"] = _structural(node["items"])
    return node


def openapi_schema(model: type[BaseModel] = PDDeployment) -> dict:
    raw = model.model_json_schema(by_alias=True)
    defs = raw.pop("$defs", {})
    resolved = _resolve(raw, defs)
    props = resolved["properties"]
    schema = {
        "type": "object",
        "description": resolved.get("description", ""),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _structural(props["spec"]),
            "status": _structural(props["status"]),
        },
    }
    return schema


def crd(kind: Kind = PDDEPLOYMENT) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name, "labels": {APP_NAME: MANAGER, PART_OF: MANAGER}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": kind.plural, "singular": kind.kind.lower(), "kind": kind.kind,
                      "listKind": f"{kind.kind}List", "shortNames": kind.short_names,
                      "categories": ["all", "pd"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": kind.subresources,
                "additionalPrinterColumns": kind.columns,
                "schema": {"openAPIV3Schema": openapi_schema(kind.model)},
            }],
        },
    }


def crd_yaml(kind: Kind = PDDEPLOYMENT) -> str:
    header = "# Generated by `make crds` from operator/pd_operator/api/types.py. Do not edit.\n"
    return header + yaml.safe_dump(crd(kind), sort_keys=False, width=110)


def main() -> None:
    import sys
    from pathlib import Path

    for kind in KINDS:
        out = Path(sys.argv[1] if len(sys.argv) > 1 else "crds") / kind.file
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(crd_yaml(kind))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

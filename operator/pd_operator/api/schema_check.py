"""Validate a custom resource against the CRD's openAPIV3Schema, as the API server would.

kubernetes-validate only warns on custom resources, so this does it: JSON Schema for the
structural part (with the Kubernetes extensions `x-kubernetes-int-or-string`,
`x-kubernetes-preserve-unknown-fields` and `nullable` translated) and the CEL rules
(`x-kubernetes-validations`) evaluated with cel-python. Errors come back as (field path, message).
"""

from __future__ import annotations

import collections
import copy
import logging
import threading
from functools import cache
from typing import Any

import celpy
import jsonschema
from pydantic import BaseModel

from pd_operator.api.crd import openapi_schema
from pd_operator.api.types import PDDeployment

Problem = tuple[str, str]

# celpy logs every evaluation step at DEBUG (kilobytes a rule); an operator running with verbose
# logs would spend its time formatting them.
logging.getLogger("celpy").setLevel(logging.WARNING)


def _to_jsonschema(node: Any) -> Any:
    if isinstance(node, list):
        return [_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_jsonschema(v) for k, v in node.items()
           if k not in ("x-kubernetes-validations", "x-kubernetes-preserve-unknown-fields",
                        "x-kubernetes-int-or-string", "nullable")}
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        # Structural schemas prune unknown fields; a manifest that carries them has a typo we report.
        out.setdefault("additionalProperties", False)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@cache
def _crd_schema(model: type[BaseModel] = PDDeployment) -> dict:
    return openapi_schema(model)


@cache
def _validator(model: type[BaseModel] = PDDeployment) -> jsonschema.Draft7Validator:
    schema = _to_jsonschema(_crd_schema(model))
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def compile_rules(model: type[BaseModel] = PDDeployment) -> int:
    """Compile every CEL rule of `model`'s CRD schema now, and say how many: the first compile in a
    process builds cel-python's Lark parser (0.16 s of CPU for all 21 rules on a quiet machine here),
    which the first admission review or reconciles after a start would otherwise pay: in a
    100-PDDeployment run it was 5% of the operator's CPU, more than one build's worth, so reconcile
    threads starting at once likely each built it (docs/benchmarks.md#reconcile-cost)."""
    rules: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            rules.update(rule["rule"] for rule in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(_crd_schema(model))
    for rule in rules:
        _program(rule)
    return len(rules)


def _path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _cel_problems(schema: dict, value: Any, path: list) -> list[Problem]:
    out: list[Problem] = []
    if value is None:
        return out
    for rule in schema.get("x-kubernetes-validations", []):
        message = rule["message"]
        try:
            result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as err:
            result, message = err, f"{message} (the rule could not be evaluated: {err.args[0]})"
        if isinstance(result, celpy.CELEvalError) or not bool(result):
            out.append((_path(path) or "(root)", message))
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                out += _cel_problems(sub, value[key], [*path, key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                out += _cel_problems(extra, item, [*path, key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            out += _cel_problems(schema["items"], item, [*path, index])
    return out


def with_defaults(schema: dict, value: Any) -> Any:
    """The object as the API server stores it: schema defaults filled in where a field is absent
    and its parent present (CEL rules see defaulted objects)."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for key, sub in schema["properties"].items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = with_defaults(sub, out[key])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [with_defaults(schema["items"], item) for item in value]
    return value


INT64 = (-(2**63), 2**63 - 1)


def _wide_integers(value: Any, path: list) -> list[Problem]:
    """Integers outside int64, which Kubernetes cannot store and CEL cannot hold (celpy raises on
    them), even in free-form fields the schema does not bound."""
    if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        return [(_path(path) or "(root)", f"{value} is outside the 64-bit integer range")]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [p for key, item in items for p in _wide_integers(item, [*path, key])]


MEMO_SIZE = 1024
_memo: collections.OrderedDict[tuple[str, type[BaseModel]], list[Problem]] = collections.OrderedDict()
_memo_lock = threading.Lock()


def schema_problems(doc: dict, model: type[BaseModel] = PDDeployment) -> list[Problem]:
    """Every way `doc` fails the CRD schema of `model`'s kind; CEL rules run only on structurally
    valid documents, as in the API server (a rule over a wrongly typed field would only repeat the
    type error).

    metadata is checked to be a mapping and no further: its content is the API server's ObjectMeta,
    which the CRD's schema does not describe. status is not checked: both kinds have the status
    subresource (api/crd.py), so requests to the object itself ignore its status stanza (kubernetes:
    staging/src/k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1/types.go @ v1.36.3,
    CustomResourceSubresources.Status), and a status write is the operator's own; the status differs
    after each, so a reconcile would miss the memory below.

    Remembered for the last MEMO_SIZE documents by their text without metadata and status (repr tells 1 from
    "1" and 1.0, which JSON would not): the CEL rules cost most of a reconcile's and an admission
    review's CPU time (cel-python interprets them), most reconciles check a spec an earlier one
    already checked, and objects created from one manifest differ only in metadata (name, uid,
    resourceVersion, managedFields: which made every create and every reconcile after a status
    write miss the memory when it held whole documents)."""
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k != "status"}
        if isinstance(doc.get("metadata"), dict):
            doc["metadata"] = {}
    text = repr(doc)
    with _memo_lock:
        if (text, model) in _memo:
            _memo.move_to_end((text, model))
            return list(_memo[(text, model)])
    problems = _problems(doc, model)
    with _memo_lock:
        _memo[(text, model)] = list(problems)
        while len(_memo) > MEMO_SIZE:
            _memo.popitem(last=False)
    return problems


def _problems(doc: dict, model: type[BaseModel]) -> list[Problem]:
    problems = [(_path(err.absolute_path) or "(root)", err.message)
                for err in sorted(_validator(model).iter_errors(doc),
                                  key=lambda e: list(map(str, e.absolute_path)))]
    problems += _wide_integers(doc, [])
    if problems:
        return problems
    schema = _crd_schema(model)
    return _cel_problems(schema, with_defaults(schema, doc), [])

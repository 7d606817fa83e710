"""The PATCH flavours of the Kubernetes API, applied to plain dicts.

kmock 0.8 merges every PATCH body as a JSON merge patch (lists replaced wholesale) and silently
ignores server-side apply. Real clients send different flavours: kopf uses merge-patch and
json-patch (with a ``test`` op on resourceVersion for optimistic concurrency), the official
``kubernetes`` client sends strategic-merge-patch for dict bodies, and ``kubectl apply
--server-side`` sends apply-patch YAML. This module implements each one:

* ``application/merge-patch+json`` -- RFC 7386 (``None`` deletes a key, lists replaced).
* ``application/json-patch+json`` -- RFC 6902 via ``jsonpatch``; a failed ``test`` op is a 422.
* ``application/strategic-merge-patch+json`` -- merge patch, but lists of objects named in
  ``MERGE_KEYS`` are merged item-by-item on their key, ``$patch: delete|replace`` directives work
  for list items and maps, and ``$deleteFromPrimitiveList/<field>`` plus the ``finalizers``
  set-merge are honoured. Not emulated: ``$retainKeys``, ``$setElementOrder`` (dropped), and
  field-path-precise merge keys (the key is chosen by the list's field name only).
* ``application/apply-patch+yaml`` -- emulated as a strategic merge of the applied object into
  the live one. Field ownership/conflicts are not tracked; only the manager name is recorded.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)

# List field name -> merge key, as declared by `patchMergeKey` in the core/apps Go types.
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "ports": ("containerPort", "port"),  # container ports vs. service ports
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey",),
}
SET_MERGE_LISTS = {"finalizers"}  # primitive lists with patchStrategy=merge


class PatchError(ValueError):
    """The patch cannot be applied (422 Unprocessable Entity on the wire)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new object."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], ops: Any) -> dict[str, Any]:
    """RFC 6902 JSON patch; a failing ``test`` or a bad path raises :class:`PatchError`."""
    if not isinstance(ops, list):
        raise PatchError("json-patch body must be a list of operations")
    try:
        return jsonpatch.apply_patch(target, ops, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError) as e:
        raise PatchError(str(e)) from e


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch (the subset described in the module docstring)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, list):
            result[key] = [v for v in copy.deepcopy(value) if not _is_delete_directive(v)]
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(field: str, live: list[Any], patch: list[Any]) -> list[Any]:
    if field in SET_MERGE_LISTS:
        return live + [v for v in patch if v not in live]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    key = _merge_key(field, live + patch)
    if key is None:
        return copy.deepcopy(patch)
    result = [copy.deepcopy(item) for item in live]
    for item in patch:
        index = next((i for i, old in enumerate(result) if old.get(key) == item.get(key)), None)
        if _is_delete_directive(item):
            if index is not None:
                del result[index]
        elif index is None:
            result.append(copy.deepcopy(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _merge_key(field: str, items: list[Any]) -> str | None:
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    for key in MERGE_KEYS.get(field, ()):
        if all(key in item for item in items):
            return key
    return None


def _is_delete_directive(item: Any) -> bool:
    return isinstance(item, dict) and item.get("$patch") == "delete"


def apply_patch(live: dict[str, Any], patch_type: str, body: Any) -> dict[str, Any]:
    """Dispatch on the Content-Type of a PATCH request."""
    if patch_type == JSON_PATCH:
        return json_patch(live, body)
    if not isinstance(body, dict):
        raise PatchError(f"{patch_type} body must be an object")
    if patch_type == MERGE_PATCH:
        return merge_patch(live, body)
    return strategic_merge_patch(live, body)  # strategic merge and server-side apply

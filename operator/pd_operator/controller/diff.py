"""Desired vs observed children -> what to apply and what to prune. Pure: no I/O, no clock.

Every applied manifest carries a hash of itself in `pd.serving.dev/applied-hash`, so an unchanged
child needs no request at all: a reconcile of an unchanged PDDeployment writes nothing. The hash
covers exactly what the operator applies (its own fields), so status or defaulted fields written
by others never look like drift.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from pd_operator.api.labels import APPLIED_HASH
from pd_operator.render.scheduling import IMMUTABLE_SPEC

Key = tuple[str, str, str]
"""(apiVersion, kind, name): a child's identity within one namespace."""


def key(obj: dict) -> Key:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def owner_reference(owner: dict) -> dict:
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def is_owned_by(obj: dict, uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def manifest_hash(manifest: dict) -> str:
    # Stamped or not, the same manifest: its text without the hash annotation (and without an
    # annotations map left empty), the rest read in place rather than copied.
    meta = dict(manifest["metadata"])
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != APPLIED_HASH}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    text = json.dumps({**manifest, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamp(manifest: dict, owner: dict) -> dict:
    """The manifest adopted by `owner` (controller owner reference) and marked with its hash."""
    out = json.loads(json.dumps(manifest))
    out["metadata"]["ownerReferences"] = [owner_reference(owner)]
    out["metadata"].setdefault("annotations", {})[APPLIED_HASH] = manifest_hash(out)
    return out


def applied_hash(obj: dict) -> str | None:
    return (obj.get("metadata", {}).get("annotations") or {}).get(APPLIED_HASH)


def holds(observed: object, desired: object) -> bool:
    """Whether `observed` still has every field of `desired` with its value: fields the API server
    or others added are ignored, a hand edit of one the operator sets (replicas, image, env) is
    not, even when the applied-hash annotation was left as it was. Scalars compare as text since
    the API server returns quantities as strings."""
    if isinstance(desired, dict):
        return isinstance(observed, dict) and all(k in observed and holds(observed[k], v)
                                                  for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(observed, list) and len(observed) == len(desired)
                and all(holds(o, d) for o, d in zip(observed, desired, strict=True)))
    return str(observed) == str(desired)


def _immutable(manifest: dict) -> bool:
    """A kind whose spec the API server never changes after creation: once applied (same hash), an
    apply again cannot add what the server dropped (a field of a feature gate that is off), so it
    would only repeat on every reconcile."""
    return (manifest["apiVersion"], manifest["kind"]) in IMMUTABLE_SPEC


def differs(manifest: dict, current: dict) -> bool:
    """Whether the observed `current` is not what the stamped `manifest` applies (an apply is due)."""
    return applied_hash(current) != applied_hash(manifest) or not (holds(current, manifest)
                                                                   or _immutable(manifest))


@dataclass(frozen=True)
class Diff:
    apply: list[dict] = field(default_factory=list)
    """Stamped manifests that are missing or differ from what was last applied, in apply order."""
    prune: list[dict] = field(default_factory=list)
    """Observed children of this owner that the spec no longer wants."""
    foreign: list[dict] = field(default_factory=list)
    """Observed objects with our labels but not owned by this PDDeployment: left alone."""
    blocked: list[dict] = field(default_factory=list)
    """Desired manifests whose name a foreign object already holds: not applied."""
    unchanged: int = 0


def diff(desired: list[dict], observed: list[dict], owner_uid: str) -> Diff:
    """`desired` are stamped manifests (see `stamp`); `observed` the objects listed by our labels."""
    seen = {key(obj): obj for obj in observed}
    foreign = [obj for obj in observed if not is_owned_by(obj, owner_uid)]
    foreign_keys = {key(obj) for obj in foreign}
    apply, blocked, unchanged = [], [], 0
    for manifest in desired:
        current = seen.get(key(manifest))
        if key(manifest) in foreign_keys:
            blocked.append(manifest)
        elif current is not None and not differs(manifest, current):
            unchanged += 1
        else:
            apply.append(manifest)
    wanted = {key(m) for m in desired}
    prune = [obj for obj in observed
             if key(obj) not in wanted and key(obj) not in foreign_keys
             and not obj["metadata"].get("deletionTimestamp")]
    return Diff(apply, prune, foreign, blocked, unchanged)

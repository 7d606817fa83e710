"""The last valid spec: what the running instances keep being gated, drained and scaled on while an
update is refused. Pure.

The webhook refuses an invalid spec at apply, but the controller's validator (render/runnable.py)
also reads what the webhook may not see the same way (the model's config ConfigMap, the admin's
host-path and node-access policy, the operator's tools image), so an update can pass the one and
fail the other, and without the webhook every invalid update reaches the controller. Nothing of a
refused spec is rendered, but what runs must not freeze: a decode instance that loses its KV link
must leave the proxy's membership, a scale-down must drain, a drained instance must go. So each
reconcile of a valid spec records it in a ConfigMap of its own (`<name>-last-valid-spec`, owned like
every child), and a reconcile of a refused one goes on with the recorded spec (its children stay
exactly as that spec renders them) while the status reports the refusal and names the field.
"""

from __future__ import annotations

import json

from pd_operator.controller.diff import is_owned_by
from pd_operator.render.labels import metadata
from pd_operator.spec.validate import Resolved

KEY = "spec.json"


def record(resolved: Resolved, spec: dict) -> dict:
    """The ConfigMap recording `spec`, the user's spec as `resolved` was validated from."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(resolved, resolved.names.last_valid_spec, None),
            "data": {KEY: json.dumps(spec, indent=1, sort_keys=True) + "\n"}}


def recorded(children: list[dict], name: str, owner_uid: str) -> dict | None:
    """The spec the record among `children` holds (None: no record of ours, or not readable)."""
    for obj in children:
        if obj.get("kind") == "ConfigMap" and obj["metadata"]["name"] == name and is_owned_by(obj, owner_uid):
            try:
                spec = json.loads((obj.get("data") or {}).get(KEY) or "")
            except ValueError:
                return None
            return spec if isinstance(spec, dict) else None
    return None

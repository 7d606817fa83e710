"""Builders shared by the pure controller tests: validated examples, rendered children, fake pods."""

from __future__ import annotations

import copy
from typing import Any

from controller_support import example

from pd_operator.controller.planner import stamp
from pd_operator.render import render
from pd_operator.validate import Validation, validate

OWNER_UID = "0b1c2d3e-0000-4000-8000-000000000001"


def validated(doc: dict[str, Any] | None = None, **spec_changes: Any) -> Validation:
    doc = copy.deepcopy(doc or example())
    for path, value in spec_changes.items():
        node = doc["spec"]
        *parents, leaf = path.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return validate(doc)


def owner(validation: Validation) -> dict[str, Any]:
    dep = validation.deployment
    assert dep is not None
    return {"apiVersion": dep.api_version, "kind": dep.kind,
            "metadata": {"name": dep.name, "namespace": dep.namespace, "uid": OWNER_UID}}


def desired(validation: Validation) -> list[dict]:
    return [stamp(m, owner(validation)) for m in render(validation)]


def pods_of(manifests: list[dict], *, ready: bool = True, layout: str | None = None) -> list[dict]:
    """The pods the StatefulSets and Deployments of `manifests` would run."""
    out = []
    for m in manifests:
        if m["kind"] not in ("StatefulSet", "Deployment"):
            continue
        labels = dict(m["spec"]["template"]["metadata"]["labels"])
        if layout is not None and "pd.serving.dev/kv-layout" in labels:
            labels["pd.serving.dev/kv-layout"] = layout
        for ordinal in range(m["spec"].get("replicas", 1)):
            out.append(pod(f"{m['metadata']['name']}-{ordinal}", labels, ready=ready))
    return out


def pod(name: str, labels: dict[str, str], *, ready: bool = True, restarts: int = 0,
        phase: str = "Running") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": labels},
            "status": {"phase": phase,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "engine", "restartCount": restarts}]}}


def with_status(manifests: list[dict], ready_replicas: int | None = None) -> list[dict]:
    """Observed copies of `manifests`; Deployments report `ready_replicas` (default: all)."""
    out = []
    for m in copy.deepcopy(manifests):
        if m["kind"] == "Deployment":
            want = m["spec"].get("replicas", 1)
            m["status"] = {"readyReplicas": want if ready_replicas is None else ready_replicas}
        out.append(m)
    return out

"""Revision objects: what each revision's pods read lives in immutable objects named by it, kept
while a pod or StatefulSet of that revision remains. Pure.

A role's revision config (render/serving_config.py: preflight config and KV-link pairing) is an
immutable ConfigMap named by a hash of its data, and the role's pod template names it, so the
template's revision (render/workloads.py) covers it. The spec moving on does not remove it: an old
pod whose container restarts, or that its StatefulSet recreates on the old template, still mounts
its own revision's config (as a StatefulSet's ControllerRevisions keep each revision's template,
kubernetes: pkg/controller/history/controller_history.go @ v1.34). The reconcile's prune leaves a
revision config any observed pod or StatefulSet still names, and deletes it once none does.
"""

from __future__ import annotations

from collections.abc import Iterable

from pd_operator.api.labels import ROLE
from pd_operator.api.types import ROLES
from pd_operator.controller.pods import label


def is_config(obj: dict) -> bool:
    """A role's revision config (render/serving_config.py config_maps)."""
    return obj.get("kind") == "ConfigMap" and label(obj, ROLE) in ROLES and bool(obj.get("immutable"))


def _named_configs(pod_spec: dict) -> Iterable[str]:
    for volume in pod_spec.get("volumes") or []:
        if name := (volume.get("configMap") or {}).get("name"):
            yield name


def in_use(children: Iterable[dict], pods: Iterable[dict]) -> set[str]:
    """The ConfigMaps an observed pod or StatefulSet template mounts (a terminating pod too: it may
    still restart a container)."""
    out: set[str] = set()
    for pod in pods:
        out.update(_named_configs(pod.get("spec") or {}))
    for obj in children:
        if obj.get("kind") == "StatefulSet":
            out.update(_named_configs(((obj.get("spec") or {}).get("template") or {}).get("spec") or {}))
    return out


def kept(obj: dict, used: set[str]) -> bool:
    """Whether a child the spec no longer wants stays: a revision config still in use."""
    return is_config(obj) and obj["metadata"]["name"] in used

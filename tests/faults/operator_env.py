"""The emulated cluster and the real operator for the fault tests, and the small helpers the
scenarios share (waiting, children of a deployment, edits through the store that bypass faults)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pd_operator.controller.background import BackgroundOperator, local_options
from pd_operator.devcluster import DevCluster
from pd_operator.devcluster.patching import MERGE_PATCH

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "pd.serving.dev_pddeployments.yaml"
EXAMPLES = ROOT / "examples"
API = "pd.serving.dev/v1alpha1"
NAMESPACES = ("default", "other")
DEPLOYMENT_LABEL = "pd.serving.dev/deployment"
CHILD_KINDS = [("v1", "Service"), ("apps/v1", "StatefulSet"), ("apps/v1", "Deployment"),
               ("networking.k8s.io/v1", "NetworkPolicy"), ("policy/v1", "PodDisruptionBudget"),
               ("v1", "ConfigMap")]


def example(name: str = "glm-5.3-flash-1p1d-tp4.yaml") -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def start_operator(cluster: DevCluster, **options: Any) -> BackgroundOperator:
    return BackgroundOperator(local_options(cluster.kubeconfig_path, **options)).start()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.1,
               detail: Callable[[], Any] | None = None) -> float:
    """Seconds until `predicate()` is true; fails the test after `timeout`, with `detail()` (what is
    still wrong) in the message."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f": {detail()}" if detail else ""))
        time.sleep(poll)
    return time.monotonic() - started


def children(cluster: DevCluster, namespace: str, name: str | None = None) -> dict[str, dict]:
    """`Kind/name` -> object of every child labelled for `name` (any deployment when None)."""
    selector = f"{DEPLOYMENT_LABEL}={name}" if name else DEPLOYMENT_LABEL
    return {f"{kind}/{obj['metadata']['name']}": obj for api, kind in CHILD_KINDS
            for obj in cluster.list(api, kind, namespace, selector)}


def merge_patch(cluster: DevCluster, api_version: str, kind: str, namespace: str, name: str,
                patch: dict) -> dict:
    """A hand edit (kubectl edit): through the store, so the injected API faults never hit it."""
    rt = cluster.store.find_type(api_version, kind)
    return cluster.store.patch(rt, namespace, name, MERGE_PATCH, patch)[0]


def hand_edit(cluster: DevCluster, api_version: str, kind: str, namespace: str, name: str,
              change: Callable[[dict], None]) -> dict:
    """Read, change and replace an object (kubectl edit), through the store so no injected fault
    hits it; retried when the operator wrote it in between."""
    rt = cluster.store.find_type(api_version, kind)
    for _ in range(20):
        obj = cluster.get(api_version, kind, namespace, name)
        assert obj is not None, f"{kind} {name} is gone"
        change(obj)
        try:
            return cluster.store.update(rt, namespace, name, obj)
        except Exception as err:  # kmock's 409 on a stale resourceVersion: read again
            if getattr(err, "status", None) != 409:
                raise
    raise AssertionError(f"{kind} {name} kept changing under the edit")


def conditions(obj: dict | None) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"])
            for c in ((obj or {}).get("status") or {}).get("conditions", [])}

"""Builders for the pure controller tests: validated examples, rendered children, fake pods, each
role's revision and the rollout figures as the reconcile has them, and the gate's render with what
its proxy routes to; MemoryClient, the API as the reconcile uses it, in memory."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from pd_operator.controller import gate, pdroles, rollout
from pd_operator.controller.diff import stamp
from pd_operator.controller.proxy_state import ProxyUnreachable
from pd_operator.controller.status import Observed
from pd_operator.proxy.membership import ProxyState, parse_document
from pd_operator.render import render, workloads
from pd_operator.render.runnable import validate
from pd_operator.spec.validate import Validation
from pd_operator.transfer.gate_state import GateState
from support.renders import proxy_membership
from support.specs import EXAMPLES, example

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


def revisions(validation: Validation) -> Mapping[str, str]:
    """Each role's current revision, as the reconcile has it (render/workloads.py Templates)."""
    assert validation.resolved is not None
    return workloads.templates(validation.resolved).revisions


def with_figures(validation: Validation, observed: Observed) -> Observed:
    """`observed` with the figures the reconcile computes from its pods (controller/rollout.py)."""
    if validation.resolved is None or observed.figures is not None:
        return observed
    figures = rollout.figures(validation.resolved, revisions(validation), observed.pods)
    return replace(observed, figures=figures)


def owner(validation: Validation) -> dict[str, Any]:
    dep = validation.deployment
    assert dep is not None
    return {"apiVersion": dep.api_version, "kind": dep.kind,
            "metadata": {"name": dep.name, "namespace": dep.namespace, "uid": OWNER_UID}}


def desired(validation: Validation) -> list[dict]:
    """The stamped manifests as the reconcile applies them (PDRoles without spec.replicas)."""
    return [stamp(pdroles.applied_form(m), owner(validation)) for m in render(validation.resolved)]


def pods_of(manifests: list[dict], *, ready: bool = True, layout: str | None = None) -> list[dict]:
    """The pods the StatefulSets and Deployments of `manifests` would run."""
    out = []
    for m in manifests:
        if m["kind"] not in ("StatefulSet", "Deployment"):
            continue
        labels = dict(m["spec"]["template"]["metadata"]["labels"])
        if layout is not None and "pd.serving.dev/kv-layout" in labels:
            labels["pd.serving.dev/kv-layout"] = layout
        containers = [c["name"] for c in m["spec"]["template"]["spec"]["containers"]]
        for ordinal in range(m["spec"].get("replicas", 1)):
            out.append(pod(f"{m['metadata']['name']}-{ordinal}", labels, ready=ready, containers=containers))
    return out


def pod(name: str, labels: dict[str, str], *, ready: bool = True, restarts: int = 0,
        phase: str = "Running", containers: list[str] | None = None) -> dict:
    """A pod whose containers (default: one `engine`) are all ready or all not."""
    names = containers or ["engine"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": labels},
            "spec": {"containers": [{"name": n} for n in names]},
            "status": {"phase": phase,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": n, "restartCount": restarts if i == 0 else 0,
                                              "ready": ready} for i, n in enumerate(names)]}}


def link_down(pod: dict) -> dict:
    """The pod as the kubelet reports it once its kv-link gate fails: that container and the pod
    not ready, the engine still running."""
    out = copy.deepcopy(pod)
    for c in out["status"]["containerStatuses"]:
        if c["name"] == "kv-link":
            c["ready"] = False
    out["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return out


def pods_with_volumes(applied: list[dict]) -> list[dict]:
    """Ready pods of the StatefulSets `applied` holds, each with its template's volumes (the revision
    config it mounts)."""
    out = []
    specs = {s["metadata"]["name"]: s["spec"]["template"]["spec"]
             for s in applied if s["kind"] == "StatefulSet"}
    for pod in pods_of(with_status(applied)):
        owner = pod["metadata"]["name"].rsplit("-", 1)[0]
        pod["spec"] = copy.deepcopy(specs.get(owner, {}))
        out.append(pod)
    return out


def with_status(manifests: list[dict], ready_replicas: int | None = None) -> list[dict]:
    """Observed copies of `manifests`; Deployments report `ready_replicas` (default: all)."""
    out = []
    for m in copy.deepcopy(manifests):
        if m["kind"] == "Deployment":
            want = m["spec"].get("replicas", 1)
            m["status"] = {"readyReplicas": want if ready_replicas is None else ready_replicas}
        out.append(m)
    return out


def routable_of(validation: Validation, pods: list[dict], leaving: tuple[str, ...] = ()
                ) -> tuple[dict[str, dict[int, str]], rollout.Plan]:
    """(what the proxy may route to, the rollout's plan) as the reconcile computes them from `pods`
    and the instances status.draining names (`leaving`)."""
    resolved = validation.resolved
    assert resolved is not None
    state = gate.observe(resolved, revisions(validation), pods, leaving)
    step = rollout.plan(rollout.params_of(resolved), state, resolved.layout_hash)
    return step.routable(state), step


def gated(v: Validation, pods: list[dict], leaving: tuple[str, ...] = ()) -> list[dict]:
    """The manifests rendered with the gate's routable set."""
    routable, _ = routable_of(v, pods, leaving)
    return render(v.resolved, routable=routable)


def proxy_deployment(manifests: list[dict]) -> dict:
    return next(m for m in manifests
                if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-proxy"))


def routed_names(manifests: list[dict], role: str) -> list[str]:
    """The instances of `role` the proxy lists (its membership ConfigMap)."""
    return [u.name for u in proxy_membership(manifests).role(role)]


def gated_only_the_membership(v: Validation, out: list[dict]) -> None:
    """Everything but the membership ConfigMap is as rendered, the proxy Deployment included."""
    def others(manifests: list[dict]) -> list[dict]:
        return [m for m in manifests
                if not (m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-proxy"))]
    assert others(out) == others(render(v.resolved))
    assert proxy_deployment(out)["spec"]["replicas"] == 1


RECONCILED_UID = "0b1c2d3e-0000-4000-8000-000000000002"


class MemoryClient:
    """The API as the reconcile uses it: writes are answered with what was sent and recorded."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    def read_config_map_key(self, namespace: str, name: str, key: str) -> str | None:
        return None

    def get_child(self, manifest: dict) -> dict | None:
        return None  # an empty namespace: nothing holds a child's name

    def apply(self, manifest: dict) -> dict:
        self.writes.append(("apply", manifest))
        return copy.deepcopy(manifest)

    def create_role(self, manifest: dict) -> dict:
        self.writes.append(("create", manifest))
        return copy.deepcopy(manifest)

    def forward_replicas(self, namespace: str, name: str, patch: dict) -> dict:
        raise AssertionError("a new PDRole is created with its count, not forwarded")

    def patch_role_status(self, namespace: str, name: str, status: dict) -> dict:
        self.writes.append(("role-status", name))
        return {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDRole",
                "metadata": {"name": name, "namespace": namespace}, "status": status}

    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        self.writes.append(("status", status))

    def post_event(self, owner: dict, type_: str, reason: str, message: str) -> None:
        self.writes.append(("event", reason))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete-pod", name))

    def delete(self, obj: dict) -> None:
        raise AssertionError("nothing to prune on a first reconcile")


def reconciled_body(example: str) -> dict:
    """An example as the reconcile receives it: namespaced, with a uid and generation 1."""
    doc = yaml.safe_load((EXAMPLES / example).read_text())
    doc["metadata"] |= {"namespace": "default", "uid": RECONCILED_UID, "generation": 1}
    return doc


RUNNING_UID = "0b1c2d3e-0000-4000-8000-000000000032"
P1 = "glm-flash-prefill-1"


class RunningClient(MemoryClient):
    """The API as the reconcile uses it on a deployment that already runs: its PDRoles' counts are
    forwarded and what it prunes or drains is recorded."""

    def forward_replicas(self, namespace: str, name: str, patch: dict) -> dict:
        self.writes.append(("forward", name))
        return {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDRole",
                "metadata": {"name": name, "namespace": namespace, **patch.get("metadata", {})},
                "spec": patch.get("spec", {})}

    def delete(self, obj: dict) -> None:
        self.writes.append(("delete", f"{obj['kind']}/{obj['metadata']['name']}"))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete", f"Pod/{name}"))


class GateDialer:
    """Proxies that let every removed instance go; gates that report `behind` (a membership still
    listing prefill 1) or what was pushed."""

    def __init__(self, behind: bool) -> None:
        self.behind = behind
        self.pushed: list[tuple[list[str], dict]] = []

    def read_all(self, pods: dict, token: str | None = None) -> dict:
        return {name: ProxyState("v", {}) for name in pods}

    def push_all(self, pods: dict, document: dict) -> dict:
        self.pushed.append((sorted(pods), document))
        members = [u.name for u in parse_document(document).prefill]
        if self.behind:
            return {name: GateState("old", ("glm-flash-prefill-0", P1), True, 0, None) for name in pods}
        return {name: GateState(document["version"], tuple(members), True, 0, None) for name in pods}

    def gate(self, pod_ip: str, port: int = 0) -> GateState:
        raise ProxyUnreachable("connection refused", refused=True)


def glm_body(prefill: int) -> dict:
    """The GLM example as the reconcile receives it, with `prefill` instances."""
    doc = yaml.safe_load((EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml").read_text())
    doc["metadata"] |= {"namespace": "default", "uid": RUNNING_UID, "generation": 1}
    doc["spec"]["prefill"]["replicas"] = prefill
    return doc


def running_pods(applied: list[dict]) -> list[dict]:
    """The pods of `applied`, running with an address."""
    pods = pods_of(with_status(applied))
    for i, pod in enumerate(pods):
        pod["status"]["podIP"] = f"10.0.0.{i + 1}"
    return pods

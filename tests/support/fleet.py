"""A fleet of small PDDeployments on the real control plane, what "converged" means for it, and
the user's side of a scenario (fault tests, benchmarks).

Creates, hand edits and deletes by "the user" go to kube-apiserver directly as admin, so a
FaultProxy between the operator and the API server (faultproxy.py) faults only the operator's own
requests. Converged: every live PDDeployment has exactly the children its spec renders, each owned
by it alone, and no child is left of a deleted one.
"""

from __future__ import annotations

import copy
import math
import pathlib
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence

import yaml

from pd_operator.api.labels import DEPLOYMENT as DEPLOYMENT_LABEL
from pd_operator.api.labels import RECORDED_REVISION
from pd_operator.api.types import GROUP, PLURAL, VERSION
from pd_operator.render import render
from pd_operator.render.kinds import CHILD_KINDS
from support.cluster import ApiError, ControlPlane, NodePool, wait_for
from support.installed import OperatorProcess
from support.specs import resolve

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLEET_EXAMPLE = ROOT / "examples" / "glm-5.3-flash-1p1d-tp4.yaml"
PDD_API = f"/apis/{GROUP}/{VERSION}"


def fleet_doc(i: int, namespace: str, decode_replicas: int = 1, prefix: str = "pdd") -> dict:
    """The GLM 1P1D TP4 example (8 NPUs) as PREFIX-NNN in `namespace`."""
    doc = copy.deepcopy(yaml.safe_load(FLEET_EXAMPLE.read_text()))
    doc["metadata"] = {"name": f"{prefix}-{i:03d}", "namespace": namespace}
    doc["spec"]["decode"]["replicas"] = decode_replicas
    return dict(doc)


def fleet_nodes(objects: int, npus_per_object: int = 8) -> tuple[NodePool, ...]:
    """kwok nodes of 8 Ascend910 NPUs enough for `objects` fleet deployments of that many NPUs
    (the example: two TP4 pods), plus two spare."""
    return (NodePool("ascend910", math.ceil(objects * npus_per_object / 8) + 2, "huawei.com/Ascend910", 8,
                     {"accelerator": "ascend-910"}),)


def pdd_path(namespace: str, name: str | None = None) -> str:
    return "/".join(p for p in (f"{PDD_API}/namespaces/{namespace}/{PLURAL}", name) if p)


def resource_path(api_version: str, plural: str, namespace: str, name: str | None = None) -> str:
    root = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    return "/".join(p for p in (f"{root}/namespaces/{namespace}/{plural}", name) if p)


def child_path(ref: str, namespace: str) -> str:
    """The API path of a child named `Kind/name`."""
    kind, name = ref.split("/", 1)
    (api_version, plural), = [(av, p) for (av, k), p in CHILD_KINDS.items() if k == kind]
    return resource_path(api_version, plural, namespace, name)


def create(cp: ControlPlane, doc: dict) -> dict:
    """Create as admin (`kubectl create`), not through any fault proxy."""
    meta = doc["metadata"]
    if doc.get("kind") == "PDDeployment":
        return dict(cp.api("POST", pdd_path(meta["namespace"]), doc))
    plural = CHILD_KINDS[(doc["apiVersion"], doc["kind"])]
    return dict(cp.api("POST", resource_path(doc["apiVersion"], plural, meta["namespace"]), doc))


def merge_patch(cp: ControlPlane, path: str, patch: dict) -> dict:
    """`kubectl patch --type=merge` as admin."""
    return dict(cp.api("PATCH", path, patch, content_type="application/merge-patch+json"))


def hand_edit(cp: ControlPlane, path: str, change: Callable[[dict], None]) -> dict:
    """Read, change and replace an object as `kubectl edit` does; again on a 409 (the operator or a
    controller wrote it in between)."""
    for _ in range(20):
        obj = cp.api("GET", path)
        change(obj)
        try:
            return dict(cp.api("PUT", path, obj))
        except ApiError as err:
            if err.status != 409:
                raise
    raise AssertionError(f"{path} kept changing under the edit")


def live_deployments(cp: ControlPlane, namespace: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in cp.api("GET", pdd_path(namespace))["items"]}


def children(cp: ControlPlane, namespace: str, name: str | None = None) -> dict[str, dict]:
    """`Kind/name` -> object of every child labelled for `name` (any deployment when None), but the
    instances' revision records (`records`): what the render makes."""
    selector = f"{DEPLOYMENT_LABEL}={name}" if name else DEPLOYMENT_LABEL
    out = {}
    for (api_version, kind), plural in CHILD_KINDS.items():
        if kind == "ControllerRevision":
            continue
        try:
            items = cp.api("GET", f"{resource_path(api_version, plural, namespace)}?labelSelector={selector}")
        except ApiError as err:
            if err.status == 404:  # a kind this cluster does not serve (PodGroups without their API)
                continue
            raise
        out.update({f"{kind}/{o['metadata']['name']}": o for o in items["items"]})
    return out


def records(cp: ControlPlane, namespace: str, name: str) -> dict[str, dict]:
    """The instances' revision records (controller/revisions.py) of the PDDeployment `name`, by name
    (not the StatefulSet controller's own ControllerRevisions, which carry our labels too)."""
    selector = urllib.parse.quote(f"{DEPLOYMENT_LABEL}={name},{RECORDED_REVISION}")
    path = f"/apis/apps/v1/namespaces/{namespace}/controllerrevisions"
    items = cp.api("GET", f"{path}?labelSelector={selector}")
    return {o["metadata"]["name"]: o for o in items["items"]}


def pods(cp: ControlPlane, namespace: str) -> dict[str, dict]:
    return {f"Pod/{p['metadata']['name']}": p
            for p in cp.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]}


def expected_children(doc: dict) -> set[str]:
    """What the operator applies for `doc`: its render, and its record of the last valid spec."""
    resolved = resolve(doc)
    return {f"{m['kind']}/{m['metadata']['name']}" for m in render(resolved)} | {
        f"ConfigMap/{resolved.names.last_valid_spec}"}


def problems(cp: ControlPlane, namespace: str, specs: dict[str, dict],
             foreign: Sequence[str] = ()) -> list[str]:
    """What still differs from convergence; `specs` holds the current spec of each live deployment
    by name, `foreign` the `Kind/name` of objects with our labels that others hold."""
    out = []
    live = live_deployments(cp, namespace)
    by_owner: dict[str, set[str]] = {}
    for ref, obj in children(cp, namespace).items():
        if ref in foreign:
            continue
        owner = obj["metadata"]["labels"][DEPLOYMENT_LABEL]
        refs = obj["metadata"].get("ownerReferences") or []
        if owner not in live:
            out.append(f"orphan {ref} of deleted {owner}")
        elif [r["uid"] for r in refs] != [live[owner]["metadata"]["uid"]]:
            out.append(f"{ref} owner references {refs}")
        by_owner.setdefault(owner, set()).add(ref)
    out += [f"{name} is not live" for name in specs if name not in live]
    for name, doc in specs.items():
        missing = expected_children(doc) - by_owner.get(name, set())
        extra = by_owner.get(name, set()) - expected_children(doc)
        out += [f"{name}: missing {sorted(missing)}"] if missing else []
        out += [f"{name}: unexpected {sorted(extra)}"] if extra else []
    return out


def wait_converged(cp: ControlPlane, namespace: str, specs: dict[str, dict], what: str,
                   foreign: Sequence[str] = (), timeout: float = 600) -> None:
    """Wait (generous upper bound) until `problems` is empty; the failure names what is left."""
    try:
        wait_for(what, lambda: not problems(cp, namespace, specs, foreign), timeout, interval=1.0)
    except TimeoutError:
        raise AssertionError(f"{what}: {problems(cp, namespace, specs, foreign)[:10]}") from None


def conditions(obj: dict | None) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"])
            for c in ((obj or {}).get("status") or {}).get("conditions", [])}


def rss_mb(pid: int) -> float:
    """Resident memory of a process (Linux /proc)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def metric(op: OperatorProcess, prefix: str) -> float:
    """The sum of the operator's Prometheus samples whose line starts with `prefix`."""
    port = next(a.split("=", 1)[1] for a in op.argv if a.startswith("--metrics-port="))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


RECONCILES = "pd_operator_reconcile_total{"

"""A rollout of the GLM example with 2 prefill and 2 decode instances on the real control plane, its
pods run by support/podnet.py: what the rollout tier's tests (tests/scaling/test_rollout_*.py) and
bench/rollout.py share.

The proxy's image is set apart from the engines' (`two_by_two`), so an image change rolls the
instances and not the proxy Deployment (a proxy pod replaced under load is another matter).
`CrashingImage` is a bad image as a kubelet reports it: kwok would mark the pods Ready at once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from pd_operator.api.labels import DEPLOYMENT, REVISION, ROLE
from pd_operator.api.types import ROLES
from support.audit import Event
from support.cluster import DEFAULT_NODES, NEVER_READY_IMAGE, ControlPlane
from support.fakevllm import until
from support.fixtures import keep_workdir
from support.installed import condition, get_pdd, weights_claim
from support.kube import kubectl
from support.podnet import loopback, watch_pods
from support.specs import example

GLM = "glm-flash"
INSTANCES = {role: {f"{GLM}-{role}-{i}" for i in (0, 1)} for role in ROLES}
NEW_IMAGE = "registry.example.com/pd-operator/pd-vllm-ascend:v0.30.0rc2-seed2"
BAD_IMAGE = NEVER_READY_IMAGE
PROXY_IMAGE = "registry.example.com/pd-operator/pd-proxy:v1"
IN_PLACE = {"maxUnavailable": 1, "maxSurge": 0}
"""spec.<role>.rollout replacing instances in place, one at a time (the defaults surge one first)."""
TIMEOUT_S = 300.0


def loopback_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane of the module's own whose pods get loopback IPs (support/podnet.py)."""
    cp = ControlPlane(nodes=[loopback(DEFAULT_NODES[0])]).start()
    yield cp
    cp.stop(keep=keep_workdir(request))


def two_by_two(namespace: str) -> dict:
    doc = example(namespace=namespace)
    doc["spec"]["prefill"]["replicas"] = doc["spec"]["decode"]["replicas"] = 2
    doc["spec"].setdefault("proxy", {})["image"] = PROXY_IMAGE
    return doc


def rollout_of(doc: dict, role: str) -> dict:
    """spec.<role>.rollout of `doc`, made when absent."""
    return dict(doc["spec"][role].setdefault("rollout", {}))


def apply(cp: ControlPlane, doc: dict) -> None:
    kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc))


def create(cp: ControlPlane, doc: dict) -> None:
    cp.create_weights_volume(doc["metadata"]["namespace"], str(weights_claim(doc)))
    apply(cp, doc)


def status(cp: ControlPlane, namespace: str, name: str = GLM) -> dict:
    return dict(get_pdd(cp, namespace, name).get("status") or {})


def progressing(st: dict) -> tuple[str, str]:
    found = condition({"status": st}, "Progressing")
    return found.get("status", ""), found.get("reason", "")


async def status_until(cp: ControlPlane, namespace: str, what: str, check: Callable[[dict], Any],
                       timeout: float = TIMEOUT_S, name: str = GLM) -> dict:
    """PDDeployment `name`'s status once `check` holds for it."""
    async def seen() -> dict | None:
        st = await asyncio.to_thread(status, cp, namespace, name)
        return st if check(st) else None
    try:
        return dict(await until(what, seen, timeout, 0.1))
    except AssertionError:
        raise AssertionError(f"{what}: {json.dumps(status(cp, namespace, name), indent=1)}") from None


def rolled(old: dict[str, str]) -> Callable[[dict], bool]:
    """A status check: every instance of each role updated to a revision other than `old`'s, and
    Progressing=Complete."""
    def check(st: dict) -> bool:
        done = all((st.get(role) or {}).get("updatedInstances") == 2
                   and (st.get(role) or {}).get("revision") != old[role] for role in ROLES)
        return done and progressing(st) == ("False", "Complete")
    return check


def live_pods(cp: ControlPlane, namespace: str) -> list[dict]:
    query = urllib.parse.quote(f"{DEPLOYMENT}={GLM},{ROLE} in (prefill,decode)")
    return [p for p in cp.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={query}")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def pod_revisions(cp: ControlPlane, namespace: str) -> dict[str, set[str]]:
    """Per instance (its StatefulSet): the revision labels of its live pods."""
    out: dict[str, set[str]] = {}
    for pod in live_pods(cp, namespace):
        (owner,) = [o["name"] for o in pod["metadata"]["ownerReferences"] if o["kind"] == "StatefulSet"]
        out.setdefault(owner, set()).add(pod["metadata"]["labels"][REVISION])
    return out


def deletes_pod_of(event: Event, instance: str) -> bool:
    return (event.verb == "delete" and event.resource == "pods" and event.code < 300
            and event.name.startswith(f"{instance}-"))


def deleted(cp: ControlPlane, mark: int, namespace: str, instance: str) -> list[Event]:
    """Successful DELETEs of `instance`'s pods after audit position `mark`."""
    return [e for e in cp.audit.events(mark, namespace=namespace) if deletes_pod_of(e, instance)]


class CrashingImage:
    """While inside `with`: every pod of `namespace` with a container on `image` gets the status a
    kubelet writes for an engine that crashes at start (Running, the container waiting in
    CrashLoopBackOff, Ready=False), as soon as a watch shows the pod, and again whenever it shows
    another status. kwok never marks such a pod Ready: its `pod-ready` stage skips pods on
    NEVER_READY_IMAGE (support/cluster.py: stage_documents), so the planner never sees one Ready."""

    def __init__(self, cp: ControlPlane, namespace: str, image: str) -> None:
        self.cp, self.namespace, self.image = cp, namespace, image
        self.crashed: set[str] = set()
        """Pods (uids) given the crashing status."""
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CrashingImage:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            watch_pods(self.cp, self.namespace, "", self._crash, self._stop)
        except Exception as err:  # handed to the test by check()
            self.errors.append(repr(err))

    def _crash(self, kind: str, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        if (kind == "DELETED" or meta.get("deletionTimestamp")
                or all(c["image"] != self.image for c in spec["containers"])):
            return
        if all(s.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
               for s in (pod.get("status") or {}).get("containerStatuses") or [{}]):
            return
        statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 1,
                     "started": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                     "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}
                    for c in spec["containers"]]
        conditions = [{"type": kind, "status": "False", "reason": "ContainersNotReady"}
                      for kind in ("Ready", "ContainersReady")]
        self.cp.api("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{meta['name']}/status",
                    {"status": {"phase": "Running", "conditions": conditions, "containerStatuses": statuses}},
                    content_type="application/strategic-merge-patch+json")
        self.crashed.add(meta["uid"])

    def check(self) -> None:
        assert not self.errors, self.errors

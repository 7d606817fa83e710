"""A minimal, deterministic stand-in for the kube-controller-manager's StatefulSet/Deployment loops.

Operators that create StatefulSets or Deployments usually wait for their pods to become ready and
read ``status.readyReplicas``; without a controller manager nothing would ever happen in the
emulator. This module reacts to store changes (no polling, no timers) and converges:

* StatefulSet ``<sts>``: pods ``<sts>-0 .. <sts>-(replicas-1)``, with the template's labels plus
  ``statefulset.kubernetes.io/pod-name`` and ``controller-revision-hash``. Pods of an old template
  revision and surplus ordinals are deleted, missing ones created (all at once: no ordered
  rollout, no partitions). Status: replicas, readyReplicas, availableReplicas, currentReplicas,
  updatedReplicas, currentRevision, updateRevision, observedGeneration.
* Deployment ``<deploy>``: pods ``<deploy>-<template-hash>-<n>`` owned directly by the Deployment
  (there are no ReplicaSets); old-hash pods are replaced at once. Status: replicas,
  readyReplicas, availableReplicas, updatedReplicas, observedGeneration, and the Available and
  Progressing conditions.
* New pods are Running at once with a fake ``status.podIP`` (10.x.y.z derived from a hash of the
  pod's namespace/name: stable between runs, never routable), and Ready iff ``pod_ready``.
  Pod readiness only changes afterwards through ``pod_readiness``/``pod_failure``
  (``DevCluster.set_pod_ready``/``fail_pod``); deleted pods are recreated.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import zlib
from collections import defaultdict
from typing import Any

import kmock

from . import patching
from .store import END, Obj, ResourceType, Store

logger = logging.getLogger(__name__)

RELEVANT = {("apps", "statefulsets"), ("apps", "deployments"), ("", "pods")}


class WorkloadControllers:
    def __init__(self, store: Store, *, pod_ready: bool = True) -> None:
        self.store = store
        self.pod_ready = pod_ready
        self.pods = self._type("", "v1", "pods")
        self.sts = self._type("apps", "v1", "statefulsets")
        self.deploys = self._type("apps", "v1", "deployments")
        # Template hashes by (uid, generation): a template change bumps the generation, and
        # hashing every template on every pass was most of a pass's time.
        self._hashes: dict[tuple[str, Any], str] = {}

    def _type(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.store.resource_type(group, version, plural)
        assert rt is not None
        return rt

    async def run(self) -> None:
        watch = self.store.subscribe(asyncio.get_running_loop())
        try:
            self.reconcile_all()
            while True:
                event = await watch.queue.get()
                if event is END:
                    return
                relevant = event.bucket in RELEVANT
                while not watch.queue.empty():  # coalesce bursts into one pass
                    more = watch.queue.get_nowait()
                    if more is END:
                        return
                    relevant = relevant or more.bucket in RELEVANT
                if relevant:
                    self.reconcile_all()
        finally:
            self.store.unwatch(watch)

    def reconcile_all(self) -> None:
        # One listing of all pods per pass, grouped by owner: listing per workload made every
        # event cost O(workloads x pods) deep copies.
        pods_by_owner: dict[str, dict[str, Obj]] = defaultdict(dict)
        for pod in self.store.list(self.pods, None, shared=True)[0]:
            for ref in pod["metadata"].get("ownerReferences") or []:
                pods_by_owner[ref.get("uid")][pod["metadata"]["name"]] = pod
        hashes: dict[tuple[str, Any], str] = {}
        work = [
            (sts, self.sts, _sts_pod_names(sts), f"{sts['metadata']['name']}-{self._hash(sts, hashes)}")
            for sts in self.store.list(self.sts, None, shared=True)[0]
        ]
        for deploy in self.store.list(self.deploys, None, shared=True)[0]:
            rev = self._hash(deploy, hashes)
            names = [f"{deploy['metadata']['name']}-{rev}-{i}" for i in range(_replicas(deploy))]
            work.append((deploy, self.deploys, names, rev))
        for owner, rt, names, revision in work:
            if owner["metadata"].get("deletionTimestamp"):
                continue
            try:
                self._reconcile(owner, rt, names, revision, pods_by_owner.get(owner["metadata"]["uid"], {}))
            except kmock.KubernetesError as e:  # e.g. a foreign pod squats a name: report, keep going
                logger.warning(
                    "Cannot reconcile %s %s/%s: %s",
                    rt.kind,
                    owner["metadata"]["namespace"],
                    owner["metadata"]["name"],
                    e.message,
                )
        self._hashes = hashes  # forget deleted and superseded templates

    def _hash(self, owner: Obj, seen: dict[tuple[str, Any], str]) -> str:
        key = (owner["metadata"]["uid"], owner["metadata"].get("generation"))
        seen[key] = self._hashes.get(key) or _template_hash(owner)
        return seen[key]

    def _reconcile(
        self, owner: Obj, rt: ResourceType, names: list[str], revision: str, owned: dict[str, Obj]
    ) -> None:
        ns = owner["metadata"]["namespace"]
        revision_label = "controller-revision-hash" if rt is self.sts else "pod-template-hash"
        live = dict(owned)
        for name, pod in owned.items():
            stale = pod["metadata"].get("labels", {}).get(revision_label) != revision
            if (name not in names or stale) and not pod["metadata"].get("deletionTimestamp"):
                self.store.delete(self.pods, ns, name)
                try:  # a pod with finalizers stays, terminating
                    live[name] = self.store.get(self.pods, ns, name, shared=True)
                except kmock.KubernetesError:
                    del live[name]
        for name in names:
            if name not in live:
                live[name] = self.store.create(
                    self.pods, ns, self._pod(owner, rt, name, revision_label, revision), keep_status=True
                )
        pods = [live[name] for name in names if name in live]
        ready = sum(1 for pod in pods if _is_ready(pod))
        updated = sum(1 for pod in pods if pod["metadata"].get("labels", {}).get(revision_label) == revision)
        status: dict[str, Any] = {
            "observedGeneration": owner["metadata"]["generation"],
            "replicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "updatedReplicas": updated,
        }
        if rt is self.sts:
            status.update(
                currentReplicas=updated, updateRevision=revision, currentRevision=revision, collisionCount=0
            )
        else:
            available = ready >= _replicas(owner)
            status["conditions"] = [
                _condition(
                    "Available",
                    available,
                    "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                ),
                _condition("Progressing", True, "NewReplicaSetAvailable"),
            ]
        if {k: (owner.get("status") or {}).get(k) for k in status} != status:
            self.store.patch(
                rt,
                ns,
                owner["metadata"]["name"],
                patching.MERGE_PATCH,
                {"status": status},
                subresource="status",
            )

    def _pod(self, owner: Obj, rt: ResourceType, name: str, revision_label: str, revision: str) -> Obj:
        template = owner["spec"].get("template") or {}
        labels = {**(template.get("metadata") or {}).get("labels", {}), revision_label: revision}
        spec = copy.deepcopy(template.get("spec") or {})
        if rt is self.sts:
            labels["statefulset.kubernetes.io/pod-name"] = name
            spec.setdefault("hostname", name)
            if owner["spec"].get("serviceName"):
                spec.setdefault("subdomain", owner["spec"]["serviceName"])
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": owner["metadata"]["namespace"],
                "labels": labels,
                "annotations": dict((template.get("metadata") or {}).get("annotations", {})),
                "ownerReferences": [
                    {
                        "apiVersion": rt.api_version,
                        "kind": rt.kind,
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        ip = zlib.crc32(f"{owner['metadata']['namespace']}/{name}".encode())
        pod["status"] = {
            "phase": "Running",
            "podIP": f"10.{ip >> 16 & 255}.{ip >> 8 & 255}.{ip & 255 or 1}",
            "containerStatuses": [
                {
                    "name": c.get("name", ""),
                    "image": c.get("image", ""),
                    "restartCount": 0,
                    "started": True,
                    "ready": False,
                    "state": {"running": {}},
                }
                for c in spec.get("containers", [])
            ],
        }
        pod["status"].update(pod_readiness(pod, self.pod_ready))
        return pod


def pod_readiness(pod: Obj, ready: bool, container: str | None = None) -> dict[str, Any]:
    """The status patch that makes a pod (not) Ready; with `container`, only that container's
    readiness changes and the pod is Ready when all its containers are, as the kubelet reports."""
    statuses = (pod.get("status") or {}).get("containerStatuses", [])
    containers = [{**c, "ready": ready} if container in (None, c.get("name")) else c for c in statuses]
    if container is not None:
        ready = all(c.get("ready") for c in containers)
    flag = "True" if ready else "False"
    return {
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": flag},
            {"type": "Ready", "status": flag},
        ],
        "containerStatuses": containers,
    }


def pod_failure(pod: Obj) -> dict[str, Any]:
    """The status patch of a crashed container: restartCount+1, not ready; phase Failed for
    restartPolicy Never/OnFailure pods (the kubelet would restart the others)."""
    status = pod_readiness(pod, False)
    status["containerStatuses"] = [
        {
            **c,
            "restartCount": c.get("restartCount", 0) + 1,
            "started": False,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
        }
        for c in status["containerStatuses"]
    ]
    if (pod.get("spec") or {}).get("restartPolicy", "Always") != "Always":
        status["phase"] = "Failed"
    return status


def _is_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _replicas(owner: Obj) -> int:
    replicas = owner["spec"].get("replicas")
    return 1 if replicas is None else int(replicas)


def _template_hash(owner: Obj) -> str:
    text = json.dumps(owner["spec"].get("template") or {}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _sts_pod_names(sts: Obj) -> list[str]:
    return [f"{sts['metadata']['name']}-{i}" for i in range(_replicas(sts))]


def _condition(kind: str, ok: bool, reason: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason}

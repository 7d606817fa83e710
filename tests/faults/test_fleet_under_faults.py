"""100 PDDeployments created, updated and deleted while 10% of the operator's API calls fail (500s
and dropped connections from the FaultProxy in front of kube-apiserver, seeded): all converge, no
child is missing, extra, orphaned or owned twice, and objects of other owners that carry our labels
are never touched. Prints N, how long each phase took and how many faults the operator retried
through (figures only: no duration is asserted)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from support.faultproxy import FaultProxy
from support.fleet import (
    DEPLOYMENT_LABEL,
    child_path,
    create,
    fleet_doc,
    live_deployments,
    merge_patch,
    pdd_path,
    wait_converged,
)

pytestmark = pytest.mark.faults

N = 100
FAULT_RATE = 0.10


def foreign_objects(namespace: str, owner_uid: str) -> list[dict]:
    """Objects with a fleet deployment's label that another controller owns, or nobody does."""
    labels = {DEPLOYMENT_LABEL: "pdd-000", "app": "someone-else"}
    other_owner = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "not-a-pdd", "uid": owner_uid,
                    "controller": True}]
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "pdd-000-someone-elses", "namespace": namespace, "labels": labels,
                      "ownerReferences": other_owner}, "data": {"keep": "me"}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "pdd-001-hand-made", "namespace": namespace,
                      "labels": {**labels, DEPLOYMENT_LABEL: "pdd-001"}},
         "spec": {"ports": [{"port": 1}]}},
    ]


def test_fleet_converges_under_api_faults(control_plane, namespace, operator, fault_proxy: FaultProxy):
    cp, ns = control_plane, namespace
    anchor = create(cp, {"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "not-a-pdd", "namespace": ns}, "data": {}})
    foreign = [create(cp, obj) for obj in foreign_objects(ns, anchor["metadata"]["uid"])]
    untouched = {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in foreign}
    mark = cp.audit.mark()

    # Half of the faults answered 500, half a connection dropped before anything is forwarded.
    errors = fault_proxy.inject(status=500, probability=FAULT_RATE / 2, times=None, seed=7)
    drops = fault_proxy.inject(drop=True, probability=FAULT_RATE / (2 - FAULT_RATE), times=None, seed=8)
    operator.start(server=fault_proxy.url, drift_interval_s=3.0)
    started = time.monotonic()
    specs = {}
    for i in range(N):
        doc = fleet_doc(i, ns)
        specs[doc["metadata"]["name"]] = doc
        create(cp, doc)
    wait_converged(cp, ns, specs, "creation", foreign=list(untouched))
    created_s = time.monotonic() - started

    # Update a third (scale decode to 2) and delete another third, all at once.
    for i in range(0, N, 3):
        specs[f"pdd-{i:03d}"] = fleet_doc(i, ns, decode_replicas=2)
        merge_patch(cp, pdd_path(ns, f"pdd-{i:03d}"), {"spec": {"decode": {"replicas": 2}}})
    for i in range(1, N, 3):
        del specs[f"pdd-{i:03d}"]
        cp.api("DELETE", pdd_path(ns, f"pdd-{i:03d}"))
    wait_converged(cp, ns, specs, "updates and deletes", foreign=list(untouched))
    total_s = time.monotonic() - started
    fault_proxy.clear()

    assert set(live_deployments(cp, ns)) == set(specs)
    for ref, version in untouched.items():
        now = cp.api("GET", child_path(ref, ns))
        assert now["metadata"]["resourceVersion"] == version, f"{ref} was touched"
    foreign_names = {ref.split("/", 1)[1] for ref in untouched}
    writes_to_foreign = [str(e) for e in cp.audit.events(mark, user=operator.release.user)
                         if e.write and e.name in foreign_names]
    assert not writes_to_foreign, writes_to_foreign
    requests = fault_proxy.requests
    faulted = Counter(r.fault for r in requests if r.fault)
    injected = errors.hits + drops.hits
    print(f"fleet N={N}: created in {created_s:.1f} s, updated+deleted, total {total_s:.1f} s; "
          f"{len(requests)} operator requests, {sum(r.write for r in requests)} writes; faults injected "
          f"(retried) {injected} ({errors.hits} x 500, {drops.hits} dropped) {dict(faulted)}")
    assert injected >= N, f"too few faults to mean anything: {injected}"

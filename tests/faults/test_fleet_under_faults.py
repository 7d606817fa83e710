"""N PDDeployments created, updated and deleted while 10% of API calls fail (500s and dropped
connections, seeded): all converge, no child is missing, extra, orphaned or owned twice, and
objects of other owners that carry our labels are never touched. Prints N, the convergence time
and how many faults the operator had to retry through."""

from __future__ import annotations

import time

import pytest
from fleet import NS, fleet_doc, live_deployments, problems
from operator_env import API, DEPLOYMENT_LABEL, merge_patch, wait_until

pytestmark = pytest.mark.faults

N = 100
FAULT_RATE = 0.10
CONVERGE_S = 120


def foreign_objects(owner_uid: str) -> list[dict]:
    """Objects with a fleet deployment's label that another controller owns, or nobody does."""
    labels = {DEPLOYMENT_LABEL: "pdd-000", "app": "someone-else"}
    other_owner = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "not-a-pdd", "uid": owner_uid,
                    "controller": True}]
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "pdd-000-someone-elses", "namespace": NS, "labels": labels,
                      "ownerReferences": other_owner}, "data": {"keep": "me"}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "pdd-001-hand-made", "namespace": NS,
                      "labels": {**labels, DEPLOYMENT_LABEL: "pdd-001"}},
         "spec": {"ports": [{"port": 1}]}},
    ]


def test_fleet_converges_under_api_faults(cluster, operator):
    anchor = cluster.create({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "not-a-pdd", "namespace": NS}, "data": {}})
    foreign = [cluster.create(obj) for obj in foreign_objects(anchor["metadata"]["uid"])]
    untouched = {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in foreign}
    foreign_refs = set(untouched)

    cluster.faults.configure(rate=FAULT_RATE, kinds=["500", "drop"], seed=7)
    operator(drift_interval_s=3.0)
    started = time.monotonic()
    docs = {}
    for i in range(N):
        docs[f"pdd-{i:03d}"] = cluster.create(fleet_doc(i))
    specs = {name: fleet_doc(i) for i, name in enumerate(docs)}
    created_s = wait_until(lambda: not problems(cluster, specs, foreign_refs), CONVERGE_S, "creation",
                           detail=lambda: problems(cluster, specs, foreign_refs)[:5])

    # Update a third (scale decode to 2) and delete another third, all at once.
    for i in range(0, N, 3):
        specs[f"pdd-{i:03d}"] = fleet_doc(i, decode_replicas=2)
        merge_patch(cluster, API, "PDDeployment", NS, f"pdd-{i:03d}", {"spec": {"decode": {"replicas": 2}}})
    for i in range(1, N, 3):
        del specs[f"pdd-{i:03d}"]
        cluster.delete(API, "PDDeployment", NS, f"pdd-{i:03d}")
    changed_s = wait_until(lambda: not problems(cluster, specs, foreign_refs), CONVERGE_S,
                           "updates and deletes", detail=lambda: problems(cluster, specs, foreign_refs)[:5])
    total_s = time.monotonic() - started
    injected = dict(cluster.faults.injected)
    cluster.faults.off()

    assert set(live_deployments(cluster)) == set(specs)
    for ref, version in untouched.items():
        kind, name = ref.split("/")
        obj = cluster.get("v1", kind, NS, name)
        assert obj is not None and obj["metadata"]["resourceVersion"] == version, f"{ref} was touched"
    writes_to_foreign = [r for r in cluster.requests if r.method != "GET"
                         and any(r.path.endswith(f"/{ref.split('/')[1]}") for ref in foreign_refs)]
    assert not writes_to_foreign, [(r.method, r.path) for r in writes_to_foreign]
    figures = (f"fleet N={N}: created in {created_s:.1f} s, updated+deleted in {changed_s:.1f} s, "
               f"total {total_s:.1f} s; faults injected (retried) {sum(injected.values())} {injected}")
    print(figures)
    assert sum(injected.values()) >= N, f"too few faults to mean anything: {figures}"

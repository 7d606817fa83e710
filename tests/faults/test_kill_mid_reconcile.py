"""The operator process (`python -m pd_operator run`, as the image starts it) SIGKILLed at random
points of its reconciles, again and again: each run finds a new PDDeployment to create plus the
unfinished work of the killed runs; a fresh operator always converges, and no child or pod is ever
created twice (its uid never changes once seen)."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest
from fleet import NS, fleet_doc, problems
from operator_env import children, wait_until

from pd_operator.localnet import free_port

pytestmark = pytest.mark.faults

KILLS = 20
SEED = 20


def spawn(cluster, log) -> subprocess.Popen:
    argv = [sys.executable, "-m", "pd_operator", "run", "--kubeconfig", cluster.kubeconfig_path,
            "--no-webhook",
            f"--health-port={free_port()}", f"--metrics-port={free_port()}"]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def test_operator_killed_at_random_points_converges_without_duplicates(cluster, operator, tmp_path):
    rng = random.Random(SEED)
    # Slow writes stretch each reconcile over seconds, so kills land between its steps.
    cluster.faults.configure(rate=1.0, kinds=["slow"], verbs=["patch", "create", "delete"], delay_s=0.15)
    specs: dict[str, dict] = {}
    seen: dict[str, str] = {}
    recreated: list[str] = []

    def observe() -> None:
        objects = {**children(cluster, NS), **{f"Pod/{p['metadata']['name']}": p
                                               for p in cluster.list("v1", "Pod", NS)}}
        for ref, obj in objects.items():
            uid = obj["metadata"]["uid"]
            if seen.setdefault(ref, uid) != uid:
                recreated.append(ref)
                seen[ref] = uid

    mid_reconcile = 0
    with (tmp_path / "operator.log").open("w") as log:
        for i in range(KILLS):
            specs[f"pdd-{i:03d}"] = fleet_doc(i, decode_replicas=1 + i % 2)
            cluster.create(specs[f"pdd-{i:03d}"])
            writes_before = cluster.requests.count_writes()
            proc = spawn(cluster, log)
            time.sleep(rng.uniform(1.5, 4.0))  # ~1.5 s to start, then some way into its work
            proc.kill()
            proc.wait(timeout=10)
            observe()
            wrote = cluster.requests.count_writes() > writes_before
            mid_reconcile += wrote and bool(problems(cluster, specs))
    cluster.faults.off()

    operator()
    converge_s = wait_until(lambda: not problems(cluster, specs), 60, "convergence after the kills",
                            detail=lambda: problems(cluster, specs)[:5])
    time.sleep(1.0)  # let the workload controllers create every pod
    observe()
    print(f"operator kills: {KILLS}, {mid_reconcile} with writes done and work left; converged "
          f"{converge_s:.1f} s after the last; {len(seen)} objects seen, recreated {len(recreated)}")
    assert not recreated, recreated
    assert mid_reconcile >= KILLS // 3, f"only {mid_reconcile} kills interrupted a reconcile"
    pods = cluster.list("v1", "Pod", NS)
    # One prefill pod and the decode pods of each; no proxy pod: the pods here never become ready, so
    # no decode instance has a proven KV link and every proxy stays scaled to zero.
    want_pods = sum(1 + spec["spec"]["decode"]["replicas"] for spec in specs.values())
    proxies = [d for d in cluster.list("apps/v1", "Deployment", NS)
               if d["metadata"]["name"].endswith("-proxy")]
    assert len(proxies) == KILLS and all(d["spec"]["replicas"] == 0 for d in proxies)
    assert len(pods) == want_pods, sorted(p["metadata"]["name"] for p in pods)
    for obj in children(cluster, NS).values():
        assert len(obj["metadata"]["ownerReferences"]) == 1

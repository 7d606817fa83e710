"""The operator process (`python -m pd_operator run`, as the image starts it) SIGKILLed at random
points of its reconciles, again and again: each run finds a new PDDeployment to create plus the
unfinished work of the killed runs; a fresh operator always converges, and no child or pod is ever
created twice (its uid never changes once seen).

Each kill is triggered by an event, not a timer: the run is killed as soon as the API server has
seen its k-th write (k drawn per run), while that write is still being served, so every kill lands
inside a reconcile whatever the speed of the machine."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from fleet import NS, fleet_doc, problems
from operator_env import children, wait_until

from pd_operator.localnet import free_port

pytestmark = pytest.mark.faults

KILLS = 20
SEED = 20
# A new PDDeployment alone takes more writes than this (its children), so the k-th write of a run
# always exists and always leaves work for the next run.
MAX_WRITES_BEFORE_KILL = 6


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
            kill_at = cluster.requests.count_writes() + rng.randint(1, MAX_WRITES_BEFORE_KILL)
            proc = spawn(cluster, log)
            wait_until(lambda kill_at=kill_at, proc=proc:
                       cluster.requests.count_writes() >= kill_at or proc.poll() is not None,
                       120, f"write {kill_at} of operator run {i}", poll=0.005)
            assert proc.poll() is None, f"operator run {i} exited by itself ({proc.returncode})"
            proc.kill()
            proc.wait(timeout=10)
            observe()
            mid_reconcile += bool(problems(cluster, specs))
    cluster.faults.off()

    operator()
    converge_s = wait_until(lambda: not problems(cluster, specs), 60, "convergence after the kills",
                            detail=lambda: problems(cluster, specs)[:5])
    # One prefill pod and the decode pods of each; no proxy pod: the pods here never become ready, so
    # no decode instance has a proven KV link and every proxy stays scaled to zero.
    want_pods = sum(1 + spec["spec"]["decode"]["replicas"] for spec in specs.values())
    wait_until(lambda: len(cluster.list("v1", "Pod", NS)) == want_pods, 60, "every pod created",
               detail=lambda: len(cluster.list("v1", "Pod", NS)))
    observe()
    print(f"operator kills: {KILLS}, {mid_reconcile} with work left; converged "
          f"{converge_s:.1f} s after the last; {len(seen)} objects seen, recreated {len(recreated)}")
    assert not recreated, recreated
    assert mid_reconcile == KILLS, f"only {mid_reconcile} of {KILLS} kills interrupted a reconcile"
    pods = cluster.list("v1", "Pod", NS)
    proxies = [d for d in cluster.list("apps/v1", "Deployment", NS)
               if d["metadata"]["name"].endswith("-proxy")]
    assert len(proxies) == KILLS and all(d["spec"]["replicas"] == 0 for d in proxies)
    assert len(pods) == want_pods, sorted(p["metadata"]["name"] for p in pods)
    for obj in children(cluster, NS).values():
        assert len(obj["metadata"]["ownerReferences"]) == 1

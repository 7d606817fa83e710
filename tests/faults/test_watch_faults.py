"""Watch streams cut and answered 410 Gone while deployments are created and changed: kopf relists,
the operator sees every change and converges. Prints how many streams were cut and how many 410s
were served."""

from __future__ import annotations

import threading

import pytest
from fleet import NS, fleet_doc, problems
from operator_env import API, merge_patch, wait_until

pytestmark = pytest.mark.faults

N = 6


def test_operator_relists_after_dropped_watches_and_410(cluster, operator):
    operator(drift_interval_s=60.0)  # no drift loop help within the test: only watches drive it
    cluster.faults.configure(rate=0.5, kinds=["410"], verbs=["watch"], seed=3)
    stop = threading.Event()
    cuts = []

    def cut_streams() -> None:
        while not stop.wait(0.7):
            cuts.append(cluster.break_watches())

    cutter = threading.Thread(target=cut_streams, daemon=True)
    cutter.start()
    try:
        specs = {}
        for i in range(N):
            specs[f"pdd-{i:03d}"] = fleet_doc(i)
            cluster.create(specs[f"pdd-{i:03d}"])
        created_s = wait_until(lambda: not problems(cluster, specs), 60, "creation",
                               detail=lambda: problems(cluster, specs)[:5])
        for i in range(0, N, 2):
            specs[f"pdd-{i:03d}"] = fleet_doc(i, decode_replicas=2)
            merge_patch(cluster, API, "PDDeployment", NS, f"pdd-{i:03d}",
                        {"spec": {"decode": {"replicas": 2}}})
        updated_s = wait_until(lambda: not problems(cluster, specs), 60, "updates",
                               detail=lambda: problems(cluster, specs)[:5])
    finally:
        stop.set()
        cutter.join()
        gone = cluster.faults.injected["410"]
        cluster.faults.off()
    # kopf lists whole resources; the operator's own lists carry a label selector.
    relists = len([r for r in cluster.requests.by_verb("list") if "labelSelector" not in r.query])
    print(f"watch faults N={N}: {sum(cuts)} streams cut, {gone} answered 410, {relists} lists; created in "
          f"{created_s:.1f} s, updated in {updated_s:.1f} s")
    assert sum(cuts) > 0 and gone > 0
    assert relists > 9, "kopf never relisted"  # 9: the initial list of each watched resource

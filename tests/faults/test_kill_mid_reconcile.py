"""The operator process (the chart's command, as its ServiceAccount) SIGKILLed in the middle of its
reconciles, again and again: the FaultProxy in front of kube-apiserver kills it right after the
API server applied its Nth write (N seeded, fewer than the children the newest deployment needs,
so every kill lands while work is left) and before the operator saw the answer. Each run
finds a new PDDeployment plus the unfinished work of the killed runs; a fresh operator converges,
and no child or pod is ever created twice (its uid never changes once seen)."""

from __future__ import annotations

import random

import pytest

from support.cluster import wait_for
from support.faultproxy import FaultProxy
from support.fleet import children, create, expected_children, fleet_doc, pods, problems, wait_converged

pytestmark = pytest.mark.faults

KILLS = 20
SEED = 20
KILL_TIMEOUT_S = 300  # generous bound on one run reaching its Nth write


def test_operator_killed_mid_reconcile_converges_without_duplicates(control_plane, namespace, operator,
                                                                     fault_proxy: FaultProxy):
    cp, ns = control_plane, namespace
    rng = random.Random(SEED)
    specs: dict[str, dict] = {}
    seen: dict[str, str] = {}
    recreated: list[str] = []

    def observe() -> None:
        for ref, obj in {**children(cp, ns), **pods(cp, ns)}.items():
            uid = obj["metadata"]["uid"]
            if seen.setdefault(ref, uid) != uid:
                recreated.append(ref)
                seen[ref] = uid

    mark = cp.audit.mark()
    work_left, writes_at = 0, []
    for i in range(KILLS):
        doc = fleet_doc(i, ns, decode_replicas=1 + i % 2)
        specs[doc["metadata"]["name"]] = doc
        create(cp, doc)
        nth = rng.randint(1, len(expected_children(doc)) - 1)
        op = operator.prepare(server=fault_proxy.url)
        killed = fault_proxy.on_write(nth, lambda _write, op=op: operator.kill(op), namespace=ns)
        operator.launch(op)
        assert killed.wait(KILL_TIMEOUT_S), f"run {i + 1} never made {nth} writes:\n{op.output()[-3000:]}"
        assert not op.running()
        writes_at.append(nth)
        observe()
        work_left += bool(problems(cp, ns, specs))
    fault_proxy.clear()

    operator.start(server=fault_proxy.url)
    wait_converged(cp, ns, specs, "convergence after the kills")
    # Every pod the StatefulSet and Deployment controllers were asked for (the proxy's replicas follow
    # the decode instances' proven KV links, so they are read, not rendered).
    def pods_made() -> bool:
        wanted = sum(o["spec"]["replicas"] for ref, o in children(cp, ns).items()
                     if ref.split("/")[0] in ("StatefulSet", "Deployment"))
        return len(pods(cp, ns)) == wanted
    wait_for("every pod", pods_made, 300, interval=1.0)
    observe()
    operator_deletes = [str(e) for e in cp.audit.events(mark, user=operator.release.user, verb="delete")]
    print(f"operator kills: {KILLS} (at writes {writes_at}), {work_left} left work for the next run; "
          f"{len(seen)} objects seen, recreated {len(recreated)}, operator deletes {len(operator_deletes)}")
    assert not recreated, recreated
    assert work_left == KILLS, f"only {work_left} of {KILLS} kills interrupted a reconcile"
    for ref, obj in children(cp, ns).items():
        assert len(obj["metadata"]["ownerReferences"]) == 1, ref

"""Watch streams cut and answered 410 Gone (the FaultProxy in front of kube-apiserver) while
deployments are created and changed: kopf relists, the operator sees every change and converges
with no drift pass to help it. Every watch is cut each time the operator has acted on a change
(an event, not a timer); half of the watch requests are answered with the ERROR event carrying a
410 Status the API server sends for a compacted resourceVersion. Prints how many streams were cut,
how many 410s were served and how many lists kopf made."""

from __future__ import annotations

import pytest

from support.cluster import wait_for
from support.faultproxy import FaultProxy
from support.fleet import create, expected_children, fleet_doc, merge_patch, pdd_path, wait_converged

pytestmark = pytest.mark.faults

N = 6
# No drift pass within the test: only the watches can tell the operator about a change.
DRIFT_S = 3600.0


def test_operator_relists_after_dropped_watches_and_410(control_plane, namespace, operator,
                                                         fault_proxy: FaultProxy):
    cp, ns = control_plane, namespace
    gone = fault_proxy.inject(verb="watch", status=410, probability=0.5, times=None, seed=3)
    operator.start(server=fault_proxy.url, drift_interval_s=DRIFT_S)
    cuts = 0

    def acted_on(name: str, since: int) -> bool:
        """The operator wrote a child of `name` after request number `since`."""
        return any(r.write and r.name.startswith(f"{name}-") for r in fault_proxy.requests[since:])

    def change_then_cut(name: str, change) -> None:
        nonlocal cuts
        since = len(fault_proxy.requests)
        change()
        wait_for(f"the operator acting on {name}", lambda: acted_on(name, since), 300)
        cuts += fault_proxy.cut_watches()

    specs = {}
    for i in range(N):
        doc = fleet_doc(i, ns)
        specs[doc["metadata"]["name"]] = doc
        change_then_cut(doc["metadata"]["name"], lambda doc=doc: create(cp, doc))
    wait_converged(cp, ns, specs, "creation")
    for i in range(0, N, 2):
        name = f"pdd-{i:03d}"
        specs[name] = fleet_doc(i, ns, decode_replicas=2)
        assert expected_children(specs[name]) != expected_children(fleet_doc(i, ns))
        change_then_cut(name, lambda name=name: merge_patch(cp, pdd_path(ns, name),
                                                             {"spec": {"decode": {"replicas": 2}}}))
    wait_converged(cp, ns, specs, "updates")
    fault_proxy.clear()

    # kopf lists whole resources when a watch (re)starts; the operator's own lists carry a selector.
    lists = [r for r in fault_proxy.requests if r.verb == "list" and "labelSelector" not in r.query]
    pdd_lists = [r for r in lists if r.resource == "pddeployments"]
    watched = {r.resource for r in lists}
    print(f"watch faults N={N}: {cuts} streams cut, {gone.hits} watches answered 410, {len(lists)} lists "
          f"of {len(watched)} resources ({len(pdd_lists)} of pddeployments)")
    assert cuts > 0 and gone.hits > 0
    assert len(lists) > len(watched), "kopf never relisted"

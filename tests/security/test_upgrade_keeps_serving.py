"""Upgrading to the node-access rules keeps serving (issue 33, point 4), on the real control plane:
a PDDeployment on the host network serves under an operator that allowed it (as every operator
before these rules did); the operator is replaced by one started without the option. It refuses
the spec (Ready=False/HostNetworkNotAllowed, naming the flag and the chart value) and writes
nothing to the children: the same objects, the same pods, serving on."""

from __future__ import annotations

import pytest

from support.cluster import wait_for
from support.installed import condition, get_pdd
from support.pdd_cluster import GLM, apply, children, glm, operator_writes, pods, serve, wait_cond

pytestmark = [pytest.mark.security, pytest.mark.integration]


def test_a_running_host_network_deployment_keeps_its_children_when_the_option_goes(
        control_plane, namespace, release, start_operator):
    cp = control_plane
    older = start_operator("--allow-host-network", "--drift-interval=1")
    doc = glm(namespace)
    doc["spec"]["decode"]["hostNetwork"] = True
    apply(cp, doc)
    serve(cp, namespace)
    before = {k: v["metadata"]["uid"] for k, v in children(cp, namespace).items()}
    serving = {p["metadata"]["uid"] for p in pods(cp, namespace)}
    assert before and serving
    older.stop()

    mark = cp.audit.mark()
    upgraded = start_operator("--drift-interval=1")
    wait_cond(cp, namespace, "Ready", ("False", "HostNetworkNotAllowed"))
    message = condition(get_pdd(cp, namespace, GLM), "Ready")["message"]
    assert "--allow-host-network" in message and "nodeAccess.hostNetwork" in message, message
    # Drift reconciles keep refusing, and keep writing nothing to the children.
    drifts = upgraded.metric("pd_operator_reconcile_total", trigger="drift")
    wait_for("two drift reconciles", lambda: upgraded.metric("pd_operator_reconcile_total", trigger="drift")
             >= drifts + 2)
    assert operator_writes(cp, mark, release.user, namespace, children_only=True) == []
    assert {k: v["metadata"]["uid"] for k, v in children(cp, namespace).items()} == before
    assert {p["metadata"]["uid"] for p in pods(cp, namespace)} == serving

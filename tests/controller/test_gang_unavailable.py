"""Gang scheduling asked of a cluster that cannot do it: the session's control plane is a stock v1.36
(no scheduling.k8s.io/v1alpha2, no Volcano CRD). The operator says so in the status, applies no
StatefulSet (no pod is created to wait half-placed), keeps running, and serves once gang is none."""

from __future__ import annotations

import pytest

from support.cluster import wait_for
from support.installed import condition, get_pdd
from support.pdd_cluster import apply, children, cond, glm, patch_spec, serve, wait_cond

pytestmark = [pytest.mark.integration, pytest.mark.scaling]


def _gang_message(cp, namespace: str) -> str:
    return str(condition(get_pdd(cp, namespace, "glm-flash"), "GangScheduling")["message"])


def test_gang_without_its_api_is_a_clear_status_and_no_pods(control_plane, namespace, start_operator):
    cp = control_plane
    op = start_operator("--drift-interval=2")
    doc = glm(namespace)
    doc["spec"]["decode"]["dataParallelSize"] = 4  # DP4 x TP4 on nodes of 8: 2 pods per instance
    doc["spec"]["scheduling"] = {"gang": "kubernetes"}
    apply(cp, doc)

    wait_cond(cp, namespace, "GangScheduling", ("False", "GangUnavailable"))
    assert cond(cp, namespace, "Ready") == ("False", "GangUnavailable")
    message = _gang_message(cp, namespace)
    assert "scheduling.k8s.io/v1alpha2" in message and "GenericWorkload=true,GangScheduling=true" in message
    kinds = {ref.split("/")[0] for ref in children(cp, namespace)}
    assert "StatefulSet" not in kinds and "PodGroup" not in kinds, kinds
    assert "ConfigMap" in kinds  # applied before the PodGroups

    patch_spec(cp, namespace, {"scheduling": {"gang": "volcano"}})
    wait_for("the Volcano requirement in the status",
             lambda: "podgroups.scheduling.volcano.sh" in _gang_message(cp, namespace))
    assert "StatefulSet" not in {ref.split("/")[0] for ref in children(cp, namespace)}

    patch_spec(cp, namespace, {"scheduling": {"gang": "none"}})
    serve(cp, namespace)
    assert cond(cp, namespace, "GangScheduling") == ("False", "PartialPlacementPossible")
    assert "decode instances (2 pods each)" in _gang_message(cp, namespace)
    assert op.running() and "Traceback" not in op.output(), op.output()[-3000:]

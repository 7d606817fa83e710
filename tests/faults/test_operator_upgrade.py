"""An operator upgrade restarts no engine by itself (issue 32 item 5, issue 33), on the real control
plane: the operator is replaced by one with another `--tools-image` (as a chart upgrade does); the
instances' StatefulSets keep their template and generation, their pods keep running (same uids), and
the status names the instances on the older tools (ToolsCurrent=False/OlderTools). The pure
counterpart, with the opt-in that rolls them: tests/controller/test_tools_upgrade.py."""

from __future__ import annotations

import pytest

from pd_operator.api.labels import DEPLOYMENT
from support.cluster import wait_for
from support.fleet import conditions, create, fleet_doc, pdd_path, wait_converged

pytestmark = pytest.mark.faults

NAME = "pdd-000"
NEW_TOOLS = "ghcr.io/pd-serving/pd-operator:99.0.0"
DRIFT_S = 2.0


def _engines(cp, namespace: str) -> tuple[dict[str, tuple[int, dict]], dict[str, str]]:
    """Each StatefulSet's (generation, template) and each pod's uid."""
    selector = f"labelSelector={DEPLOYMENT}%3D{NAME}"
    sets = cp.api("GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets?{selector}")["items"]
    pods = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods?{selector}")["items"]
    return ({s["metadata"]["name"]: (s["metadata"]["generation"], s["spec"]["template"]) for s in sets},
            {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods
             if "statefulset.kubernetes.io/pod-name" in p["metadata"].get("labels", {})})


def test_a_new_tools_image_restarts_no_engine(control_plane, namespace, operator):
    cp = control_plane
    first = operator.start(drift_interval_s=DRIFT_S)
    spec = fleet_doc(0, namespace)
    create(cp, spec)
    wait_converged(cp, namespace, {NAME: spec}, "convergence")
    sets, pods = _engines(cp, namespace)
    assert sets and pods
    operator.kill(first)

    operator.start(drift_interval_s=DRIFT_S, extra_args=[f"--tools-image={NEW_TOOLS}"])
    path = pdd_path(namespace, NAME)
    wait_for("ToolsCurrent=False/OlderTools", lambda: conditions(cp.api("GET", path)).get("ToolsCurrent")
             == ("False", "OlderTools"), 120)
    wait_converged(cp, namespace, {NAME: spec}, "convergence after the upgrade")
    assert _engines(cp, namespace) == (sets, pods)
    (message,) = [c["message"] for c in cp.api("GET", path)["status"]["conditions"]
                  if c["type"] == "ToolsCurrent"]
    assert f"{NAME}-decode-0" in message and f"{NAME}-prefill-0" in message and NEW_TOOLS in message

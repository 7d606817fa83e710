"""Hand edits of the children on the real control plane: a StatefulSet's replicas, image or env
changed by hand (`kubectl edit`, as admin) is put back by the operator; an object with the
operator's labels but no owner reference is left alone (the audit log shows no write of the
operator's to it) and reported in the Degraded condition."""

from __future__ import annotations

import pytest

from support.cluster import wait_for
from support.fleet import (
    RECONCILES,
    child_path,
    conditions,
    create,
    fleet_doc,
    hand_edit,
    metric,
    pdd_path,
    problems,
    wait_converged,
)

pytestmark = pytest.mark.faults

NAME = "pdd-000"
DECODE = f"StatefulSet/{NAME}-decode-0"
DRIFT_S = 2.0


def serving(sts: dict) -> dict:
    """The serving container itself (edits change the object)."""
    container: dict = sts["spec"]["template"]["spec"]["containers"][0]
    return container


def env_value(sts: dict, name: str) -> str | None:
    return next((e.get("value") for e in serving(sts)["env"] if e["name"] == name), None)


@pytest.fixture
def converged(control_plane, namespace, operator):
    op = operator.start(drift_interval_s=DRIFT_S)
    spec = fleet_doc(0, namespace)
    create(control_plane, spec)
    wait_converged(control_plane, namespace, {NAME: spec}, "convergence")
    return op


EDITS = {
    "replicas": (lambda sts: sts["spec"].__setitem__("replicas", 3), lambda sts: sts["spec"]["replicas"]),
    "image": (lambda sts: serving(sts).__setitem__("image", "example.com/not-the-engine:latest"),
              lambda sts: serving(sts)["image"]),
    "env": (lambda sts: next(e for e in serving(sts)["env"] if e["name"] == "VLLM_USE_V2_MODEL_RUNNER")
            .__setitem__("value", "tampered"), lambda sts: env_value(sts, "VLLM_USE_V2_MODEL_RUNNER")),
}


@pytest.mark.parametrize("field", sorted(EDITS))
def test_hand_edited_child_is_restored(control_plane, namespace, converged, field):
    cp, path = control_plane, child_path(DECODE, namespace)
    change, read = EDITS[field]
    want = read(cp.api("GET", path))
    edited = hand_edit(cp, path, change)
    assert read(edited) != want
    wait_for(f"{field} restored", lambda: read(cp.api("GET", path)) == want, 120)
    print(f"hand-edited {field}: {read(edited)!r} restored to {want!r}")


def test_labelled_object_without_owner_is_left_alone_and_reported(control_plane, namespace, operator,
                                                                   converged):
    cp, ns = control_plane, namespace
    mark = cp.audit.mark()
    stray = create(cp, {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{NAME}-debug", "namespace": ns,
                     "labels": {"pd.serving.dev/deployment": NAME, "pd.serving.dev/role": "decode"}},
        "spec": {"ports": [{"port": 9999}]}})

    def pdd() -> dict:
        return dict(cp.api("GET", pdd_path(ns, NAME)))

    wait_for("ForeignChild", lambda: conditions(pdd()).get("Degraded") == ("True", "ForeignChild"), 120)
    # Two more reconciles (drift passes) after the report, each free to touch the stray.
    runs = metric(converged, RECONCILES)
    wait_for("two more reconciles", lambda: metric(converged, RECONCILES) >= runs + 2, 120)
    now = cp.api("GET", child_path(f"Service/{NAME}-debug", ns))
    assert now["metadata"]["resourceVersion"] == stray["metadata"]["resourceVersion"]
    assert not now["metadata"].get("ownerReferences")
    touched = [str(e) for e in cp.audit.events(mark, user=operator.release.user)
               if e.write and e.name == f"{NAME}-debug"]
    assert not touched, touched
    message = next(c["message"] for c in pdd()["status"]["conditions"] if c["type"] == "Degraded")
    assert f"{NAME}-debug" in message
    assert problems(cp, ns, {NAME: fleet_doc(0, ns)}, foreign=[f"Service/{NAME}-debug"]) == []
    print(f"foreign child reported ({message!r}) and left alone through "
          f"{metric(converged, RECONCILES) - runs:.0f} reconciles")

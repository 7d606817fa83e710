"""Hand edits of the children: a StatefulSet's replicas, image or env changed by hand (kubectl
edit) is put back by the operator; an object with the operator's labels but no owner reference
is left alone and reported in the Degraded condition."""

from __future__ import annotations

import time

import pytest
from fleet import NS, fleet_doc, problems
from operator_env import conditions, hand_edit, wait_until

pytestmark = pytest.mark.faults

NAME = "pdd-000"
DECODE = f"{NAME}-decode-0"


def serving(sts: dict) -> dict:
    return sts["spec"]["template"]["spec"]["containers"][0]


def env_value(sts: dict, name: str) -> str | None:
    return next((e.get("value") for e in serving(sts)["env"] if e["name"] == name), None)


@pytest.fixture
def converged(cluster, operator):
    operator(drift_interval_s=2.0)
    spec = fleet_doc(0)
    cluster.create(spec)
    wait_until(lambda: not problems(cluster, {NAME: spec}), 30, "convergence",
               detail=lambda: problems(cluster, {NAME: spec}))
    return cluster.get("apps/v1", "StatefulSet", NS, DECODE)


EDITS = {
    "replicas": (lambda sts: sts["spec"].__setitem__("replicas", 3), lambda sts: sts["spec"]["replicas"]),
    "image": (lambda sts: serving(sts).__setitem__("image", "example.com/not-the-engine:latest"),
              lambda sts: serving(sts)["image"]),
    "env": (lambda sts: next(e for e in serving(sts)["env"] if e["name"] == "VLLM_USE_V2_MODEL_RUNNER")
            .__setitem__("value", "tampered"), lambda sts: env_value(sts, "VLLM_USE_V2_MODEL_RUNNER")),
}


@pytest.mark.parametrize("field", sorted(EDITS))
def test_hand_edited_child_is_restored(cluster, converged, field):
    change, read = EDITS[field]
    want = read(converged)
    hand_edit(cluster, "apps/v1", "StatefulSet", NS, DECODE, change)
    assert read(cluster.get("apps/v1", "StatefulSet", NS, DECODE)) != want
    restored_s = wait_until(lambda: read(cluster.get("apps/v1", "StatefulSet", NS, DECODE)) == want, 10,
                            f"{field} restored")
    print(f"hand-edited {field} restored in {restored_s:.1f} s")


def test_labelled_object_without_owner_is_left_alone_and_reported(cluster, converged):
    stray = cluster.create({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{NAME}-debug", "namespace": NS,
                     "labels": {"pd.serving.dev/deployment": NAME, "pd.serving.dev/role": "decode"}},
        "spec": {"ports": [{"port": 9999}]}})
    def pdd() -> dict:
        return cluster.get("pd.serving.dev/v1alpha1", "PDDeployment", NS, NAME)
    reported_s = wait_until(lambda: conditions(pdd()).get("Degraded") == ("True", "ForeignChild"), 20,
                            "ForeignChild")
    time.sleep(3)  # a drift reconcile or two more
    now = cluster.get("v1", "Service", NS, f"{NAME}-debug")
    assert now is not None and now["metadata"]["resourceVersion"] == stray["metadata"]["resourceVersion"]
    assert not now["metadata"].get("ownerReferences")
    message = next(c["message"] for c in pdd()["status"]["conditions"] if c["type"] == "Degraded")
    assert f"{NAME}-debug" in message
    print(f"foreign child reported in {reported_s:.1f} s and left alone")

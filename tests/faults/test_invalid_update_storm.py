"""50 invalid updates in a row to a Ready PDDeployment (as if the webhook were down or set to
Ignore): its children are never changed, and after each update the status reports that
rejection (observedGeneration follows the spec, Ready=False with the update's first error code)."""

from __future__ import annotations

import copy

import pytest
from fleet import NS, fleet_doc, problems
from operator_env import API, children, conditions, hand_edit, wait_until

from pd_operator.validate import validate

pytestmark = pytest.mark.faults

UPDATES = 50
NAME = "pdd-000"


def _invalid_specs(spec: dict) -> list[dict]:
    """Invalid specs of different kinds, each a full replacement of the valid one."""
    def changed(path: str, value) -> dict:
        out = copy.deepcopy(spec)
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
        return out
    return [changed("decode.tensorParallelSize", 3),
            changed("decode.extraArgs", ["--block_size=16"]),
            changed("prefill.env", [{"name": "VLLM_HOST_IP", "value": "10.0.0.1"}]),
            changed("kvTransfer.kvPort", 15500),
            changed("kvTransfer.metadata", {"mode": "http", "serverPort": 8000}),
            changed("prefill.tensorParallelSize", 16),
            changed("decode.pipelineParallelSize", 2)]


def ready_all_pods(cluster) -> None:
    for pod in cluster.list("v1", "Pod", NS):
        if not any(c["type"] == "Ready" and c["status"] == "True"
                   for c in pod.get("status", {}).get("conditions", [])):
            cluster.set_pod_ready(NS, pod["metadata"]["name"], True)


def test_invalid_update_storm_keeps_children_and_reports_each(cluster, operator):
    operator(drift_interval_s=5.0)
    doc = fleet_doc(0)
    cluster.create(doc)

    def pdd() -> dict:
        return cluster.get(API, "PDDeployment", NS, NAME)

    def ready() -> bool:
        ready_all_pods(cluster)
        return conditions(pdd()).get("Ready") == ("True", "Serving")
    wait_until(lambda: not problems(cluster, {NAME: doc}), 30, "children")
    wait_until(ready, 30, "Ready", detail=lambda: conditions(pdd()))
    before = {ref: obj["metadata"]["resourceVersion"] for ref, obj in children(cluster, NS).items()}

    specs = _invalid_specs(doc["spec"])
    reported, slowest = 0, 0.0
    for i in range(UPDATES):
        spec = specs[i % len(specs)]
        code = validate({**doc, "spec": spec}).errors[0].code
        updated = hand_edit(cluster, API, "PDDeployment", NS, NAME,
                            lambda obj, s=spec: obj.__setitem__("spec", s))
        generation = updated["metadata"]["generation"]

        def reports(generation=generation, code=code) -> bool:
            status = pdd().get("status") or {}
            return (status.get("observedGeneration") == generation
                    and conditions(pdd()).get("Ready") == ("False", code))
        slowest = max(slowest, wait_until(reports, 20, f"update {i + 1} ({code}) reported",
                                          detail=lambda: (pdd().get("status") or {}).get("conditions")))
        reported += 1
    after = {ref: obj["metadata"]["resourceVersion"] for ref, obj in children(cluster, NS).items()}
    print(f"invalid update storm: {UPDATES} updates, {reported} reported in the status (slowest "
          f"{slowest:.1f} s), children changed: {sum(before.get(k) != v for k, v in after.items())}")
    assert after == before

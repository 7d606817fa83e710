"""50 invalid updates in a row to a Ready PDDeployment on the real control plane, with the webhook
off (as if it were down or set to Ignore): kube-apiserver stores each (it passes the CRD's schema),
the operator never changes a child (the audit log shows no write of its to any child, their
generations stay), and after each update the status reports that rejection (observedGeneration
follows the spec, Ready=False with the update's first error code)."""

from __future__ import annotations

import copy

import pytest

from pd_operator.render.kinds import CHILD_KINDS
from pd_operator.render.runnable import validate
from support.cluster import wait_for
from support.fleet import (
    FLEET_EXAMPLE,
    children,
    conditions,
    create,
    fleet_doc,
    hand_edit,
    pdd_path,
    pods,
    wait_converged,
)
from support.installed import weights_claim
from support.specs import example

pytestmark = pytest.mark.faults

UPDATES = 50
NAME = "pdd-000"
CHILD_RESOURCES = set(CHILD_KINDS.values())


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
            changed("model.preset", "no-such-model"),
            changed("prefill.tensorParallelSize", 16),
            changed("decode.npusPerNode", 2)]


def identities(objects: dict[str, dict]) -> dict[str, tuple[str, int | None]]:
    """uid and generation (bumped by every spec change) of each object."""
    return {ref: (o["metadata"]["uid"], o["metadata"].get("generation")) for ref, o in objects.items()}


def test_invalid_update_storm_keeps_children_and_reports_each(control_plane, namespace, operator):
    cp, ns = control_plane, namespace
    cp.create_weights_volume(ns, str(weights_claim(example(FLEET_EXAMPLE))))
    operator.start(drift_interval_s=5.0)
    doc = fleet_doc(0, ns)
    create(cp, doc)

    def pdd() -> dict:
        return dict(cp.api("GET", pdd_path(ns, NAME)))

    wait_converged(cp, ns, {NAME: doc}, "children")
    wait_for("Ready", lambda: conditions(pdd()).get("Ready") == ("True", "Serving"), 300)
    before = identities(children(cp, ns))
    pods_before = {ref: p["metadata"]["uid"] for ref, p in pods(cp, ns).items()}
    mark = cp.audit.mark()

    specs = _invalid_specs(doc["spec"])
    codes = []
    for i in range(UPDATES):
        spec = specs[i % len(specs)]
        code = validate({**doc, "spec": spec}).errors[0].code
        updated = hand_edit(cp, pdd_path(ns, NAME), lambda obj, s=spec: obj.__setitem__("spec", s))
        generation = updated["metadata"]["generation"]

        def reports(generation=generation, code=code) -> bool:
            now = pdd()
            return ((now.get("status") or {}).get("observedGeneration") == generation
                    and conditions(now).get("Ready") == ("False", code))
        wait_for(f"update {i + 1} ({code}) reported", reports, 120)
        codes.append(code)

    after = identities(children(cp, ns))
    writes = [str(e) for e in cp.audit.events(mark, user=operator.release.user, namespace=ns)
              if e.write and e.resource.split("/")[0] in CHILD_RESOURCES | {"pods"}]
    print(f"invalid update storm: {UPDATES} updates stored by the API server, {len(codes)} reported in "
          f"the status ({len(set(codes))} codes: {sorted(set(codes))}); operator writes to children: "
          f"{len(writes)}")
    assert after == before
    assert {ref: p["metadata"]["uid"] for ref, p in pods(cp, ns).items()} == pods_before
    assert not writes, writes

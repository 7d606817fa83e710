"""Status is written through the typed models of api/types.py (`.to_wire()`): a key a model lacks
fails here, where the API server would silently prune it, and every status the controller writes
reads back through its model unchanged."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import BaseModel, ValidationError

from pd_operator.api.types import (
    Condition,
    DrainingStatus,
    InstanceStatus,
    KVLayoutStatus,
    KVLinkStatus,
    PDDeploymentStatus,
    PDRoleStatus,
    RoleStatus,
)
from pd_operator.controller import drain, links, pdroles, rollout
from pd_operator.controller import status as status_mod
from pd_operator.controller.status import Observed
from support.controller_fakes import desired, link_down, pods_of, validated, with_figures, with_status
from support.specs import example

T0 = "2026-01-01T00:00:00Z"
MINIMAL: list[tuple[type[BaseModel], dict]] = [
    (PDDeploymentStatus, {}),
    (RoleStatus, {}),
    (InstanceStatus, {"name": "x", "revision": "r", "ready": True}),
    (KVLayoutStatus, {"prefillBlockSize": 1, "decodeBlockSize": 1, "segmentTokens": 1, "hash": "h"}),
    (KVLinkStatus, {"decode": "d", "prefill": "p", "linked": True}),
    (DrainingStatus, {"name": "x", "role": "decode", "since": T0, "deleteBy": T0, "waitingFor": ""}),
    (Condition, {"type": "Ready", "status": "True", "reason": "Serving", "message": "m"}),
    (PDRoleStatus, {}),
]


@pytest.mark.parametrize(("model", "fields"), MINIMAL, ids=[m.__name__ for m, _ in MINIMAL])
def test_a_status_model_refuses_a_key_it_does_not_have(model, fields):
    model.model_validate(fields)
    with pytest.raises(ValidationError, match="extra"):
        model.model_validate({**fields, "readyInstanecs": 1})


def _reads_back(out: dict, model: type[BaseModel]) -> None:
    """`out` has no key outside `model` (extra keys are refused) and nothing the model changes."""
    assert model.model_validate(out).to_wire() == out


def test_every_status_the_controller_computes_reads_back_through_its_model():
    v = validated(prefill__replicas=2)
    assert v.resolved is not None
    children = with_status(desired(v))
    pods = pods_of(children)
    down = [link_down(p) if "decode" in p["metadata"]["name"] else p for p in pods]
    kv_links = links.link_status(v.resolved, down, [], lambda pod: {
        "peers": [{"peer": "x:1", "latencyMs": 2, "gbps": 1.5, "errors": ["refused"]}]})
    now = datetime(2026, 1, 1, tzinfo=UTC)
    leaving = drain.Drain("glm-flash-prefill-1", "prefill", 1, now, now, ("requests in flight",))
    scenarios = [
        Observed(),
        Observed(children=children, pods=pods),
        Observed(children=children, pods=down, links=kv_links, draining=[leaving.status()]),
    ]
    previous: dict = {}
    for observed in scenarios:
        out = status_mod.status(v, with_figures(v, observed), previous, 2, T0)
        _reads_back(out, PDDeploymentStatus)
        previous = out
    assert previous["kvLinks"] and previous["draining"] and previous["prefill"]["instances"]
    # An invalid spec keeps the last valid figures; what it writes reads back as well.
    refused = validated(example("incompatible-glm-tp8-tp3.yaml"))
    invalid = status_mod.status(refused, Observed(), previous, 3, T0)
    _reads_back(invalid, PDDeploymentStatus)
    assert invalid["kvLayout"] == previous["kvLayout"] and invalid["observedGeneration"] == 3
    role = pdroles.status(v.resolved, "prefill", 2, rollout.RoleFigures("r", 1, 2), 1, None, {}, 2, T0)
    _reads_back(role, PDRoleStatus)


def test_a_previous_field_this_version_cannot_read_is_not_kept():
    """A status another version of the operator wrote: the fields the model reads are kept, the
    others dropped, never written back."""
    invalid = validated(example("incompatible-glm-tp8-tp3.yaml"))
    previous = {"proxyEndpoint": "x:8000", "kvLayout": {"hash": "no block sizes"}, "fromTheFuture": 1}
    out = status_mod.status(invalid, Observed(), previous, 1, T0)
    assert out["proxyEndpoint"] == "x:8000" and "kvLayout" not in out and "fromTheFuture" not in out

"""Rollouts that hold in the seams (issue 32): each scenario of support/rollout_scenarios.py (the
1P1D example's default rollout of an env change, decode TP4 -> TP2, the GLM example's decode
DP2 -> DP4, a paused-then-resumed rollout) under a load keeping 2 requests in flight per decode, a
KV transfer in flight when a prefill drains, and engine pods Ready only once their fake engine
listens. Checked: 0 failed requests (and no engine protocol error), the rollout finished, a
serving prefill/decode pair within one KV layout at every sample of the membership the proxy routed
by, and on average at least 2 requests in flight per decode member in those samples (the load).
First, the harness itself: a marked pod is not Ready while its engine does not listen, and the
operator routes to its instance only once it does.
Only conditions are waited for; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib

import pytest

from pd_operator.api.labels import DEPLOYMENT, ROLE
from support.cluster import ControlPlane
from support.fakevllm import FakeEngine, until
from support.podnet import API_POLL_S, Kubelet
from support.rollout import TIMEOUT_S, create, loopback_plane
from support.rollout_scenarios import (
    SCENARIOS,
    Scenario,
    cleared,
    instance_names,
    run_scenario,
    scenario_doc,
    scenario_engine,
)

pytestmark = [pytest.mark.integration, pytest.mark.rollout]

control_plane = pytest.fixture(scope="module")(loopback_plane)


@dataclasses.dataclass
class GatedEngine(FakeEngine):
    """A fake engine that starts listening only once `gate` is set (a model still loading)."""

    gate: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    starting: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    async def start(self) -> FakeEngine:
        self.starting.set()
        await self.gate.wait()
        return await super().start()


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


async def _ready_only_once_serving(cp: ControlPlane, namespace: str, workdir: pathlib.Path) -> None:
    doc = scenario_doc(SCENARIOS[0], namespace)
    name = doc["metadata"]["name"]
    gate, starting = asyncio.Event(), asyncio.Event()

    def engine(instance: str, role: str, pod: dict, container: dict) -> FakeEngine:
        plain = scenario_engine(instance, role, pod, container)
        if role != "decode":
            return plain
        same = {f.name: getattr(plain, f.name) for f in dataclasses.fields(FakeEngine) if f.init}
        return GatedEngine(**same, gate=gate, starting=starting)

    await asyncio.to_thread(create, cp, doc)
    async with Kubelet(cp, namespace, name, workdir, engine) as kubelet:
        await until("the decode engine starting", starting.is_set, TIMEOUT_S, API_POLL_S)
        path = f"/api/v1/namespaces/{namespace}/pods?labelSelector={DEPLOYMENT}%3D{name},{ROLE}%3Ddecode"
        (pod,) = (await asyncio.to_thread(cp.api, "GET", path))["items"]
        assert pod["status"]["phase"] == "Running" and pod["status"].get("podIP")
        assert not _ready(pod), "kwok marked the decode pod Ready before its engine listened"
        listed = await kubelet.membership()
        assert listed is None or not listed.decode, f"routed to a decode that does not listen: {listed}"
        gate.set()
        await kubelet.routed(instance_names(doc, "prefill"), instance_names(doc, "decode"), TIMEOUT_S)
        (pod,) = (await asyncio.to_thread(cp.api, "GET", path))["items"]
        assert _ready(pod)
        assert all(c["ready"] for c in pod["status"]["containerStatuses"])


def test_an_engine_pod_is_ready_only_once_its_engine_serves(control_plane, namespace, start_operator,
                                                           tmp_path):
    start_operator()
    asyncio.run(_ready_only_once_serving(control_plane, namespace, tmp_path))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_a_rollout_fails_no_request_and_keeps_a_serving_pair(control_plane, namespace, start_operator,
                                                            tmp_path, scenario: Scenario):
    start_operator()
    try:
        outcome = asyncio.run(run_scenario(control_plane, namespace, tmp_path, scenario))
    finally:
        cleared(control_plane, namespace)  # the next scenario's surge needs the NPUs
    assert outcome.failed == [], outcome.failed[:10]
    assert outcome.requests > 0 and outcome.samples >= 2, outcome
    assert outcome.fewest_pairs is not None and outcome.fewest_pairs >= 1, outcome
    # The load it held: on average at least 2 requests in flight at each decode the proxy routed to.
    assert outcome.inflight_per_decode is not None and outcome.inflight_per_decode >= 2, outcome

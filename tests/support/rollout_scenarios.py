"""Rollouts that must fail no request (issue 32), each a PDDeployment of its own on the real control
plane with the operator running, its pods run by support/podnet.py: what the rollout tier's
tests/scaling/test_rollout_scenarios.py and bench/rollout.py share.

Each runs under a load that keeps 2 requests in flight per decode instance (surge ones included:
CLIENTS_PER_DECODE clients per decode), prefill taking PULL_S to hand a request's KV to decode (a
long prompt's transfer: a prefill that drains has transfers in flight) and decode streaming its
tokens TOKEN_S apart. Its engine pods are Ready only once their engine listens
(READY_WHEN_SERVING_ENV, support/cluster.py), as readiness probes make them, so the operator routes
to no instance before it serves. The membership the proxy routes by is sampled throughout, each
sample counting its serving pairs (per KV layout, the fewer of its prefill and decode members: old
and new layouts never pair). The scenarios (SCENARIOS):
- default_1p1d: the 1P1D example (one instance per role) with the default rollout settings, an env
  variable added to both roles;
- layout_change: the 1P1D example, decode TP4 -> TP2 (a new engine block size, so a new KV layout);
- decode_block: the 1P1D example, decode's block size 1152 -> 2304 alone: decode rolls, prefill keeps
  its revision, and the new decode pairs with it (its layout pairs as the prefill's);
- pods_per_instance: the GLM example, decode DP2 -> DP4 (its instance grows from one pod to two);
- paused_resumed: the 1P1D example, the env change applied paused, then resumed once the status
  says it is paused (it serves meanwhile).
Each ends when every instance runs the new revision (prefill its own in decode_block),
Progressing=Complete and the proxy routes to all of them again.
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from pd_operator.api.types import ROLES, RolloutSpec
from pd_operator.proxy.membership import Membership
from support.cluster import READY_WHEN_SERVING_ENV, ApiError, ControlPlane
from support.fakevllm import FakeEngine, Load, until
from support.podnet import API_POLL_S, Kubelet, plain_engine
from support.rollout import TIMEOUT_S, apply, create, progressing, status, status_until
from support.specs import example

EXAMPLE_1P1D = "glm-5.3-flash-1p1d-tp4.yaml"
EXAMPLE_GLM = "glm-5.3-flash-tp8-dp2tp4.yaml"
CLIENTS_PER_DECODE = 2
PULL_S = 0.3
TOKEN_S = 0.05
SAMPLE_S = 0.1
COMPLETIONS = 5
"""Requests completed before the change, while paused and after the rollout: the load goes on."""
ROUND_ENV = "BENCH_ROLLOUT_ROUND"


def env_change(doc: dict) -> None:
    for role in ROLES:
        doc["spec"][role].setdefault("env", []).append({"name": ROUND_ENV, "value": "2"})


def decode_tp2(doc: dict) -> None:
    doc["spec"]["decode"]["tensorParallelSize"] = 2


def decode_dp4(doc: dict) -> None:
    doc["spec"]["decode"]["dataParallelSize"] = 4


def decode_block(doc: dict) -> None:
    doc["spec"]["decode"]["blockSize"] = 2304


@dataclass(frozen=True)
class Scenario:
    name: str
    example: str
    change: Callable[[dict], None]
    paused: bool = False
    """Applied with both roles paused; resumed once the status says so."""
    rolls: tuple[str, ...] = ROLES
    """The roles the change gives a new revision; the others must keep theirs."""



SCENARIOS = (Scenario("default_1p1d", EXAMPLE_1P1D, env_change),
             Scenario("layout_change", EXAMPLE_1P1D, decode_tp2),
             Scenario("decode_block", EXAMPLE_1P1D, decode_block, rolls=("decode",)),
             Scenario("pods_per_instance", EXAMPLE_GLM, decode_dp4),
             Scenario("paused_resumed", EXAMPLE_1P1D, env_change, paused=True))


@dataclass
class Outcome:
    requests: int = 0
    """Requests sent."""
    failed: list[str] = field(default_factory=list)
    """Failed requests, the engines' protocol errors, and a rollout that did not finish."""
    fewest_pairs: int | None = None
    """The fewest serving pairs in a sample (None: no sample)."""
    samples: int = 0
    inflight_per_decode: float | None = None
    """The requests in flight at the decode members, per member, the mean over the samples."""


def serving_pairs(listed: Membership) -> int:
    """Prefill/decode pairs the membership can serve: per KV layout they pair as, the fewer of its
    members."""
    paired = listed.paired
    return sum(min(sum(1 for u in listed.prefill if paired(u.layout) == layout),
                   sum(1 for u in listed.decode if paired(u.layout) == layout))
               for layout in {paired(u.layout) for u in listed.prefill})


class PairSampler:
    """Samples the membership the proxy routes by (the ConfigMap's, once the proxy pod reports its
    version): the fewest serving pairs seen, how many samples, and the requests in flight per
    decode member in each."""

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        self.fewest: int | None = None
        self.samples = 0
        self.inflight_per_decode: list[float] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        proxy = await self.kubelet.proxy()
        while not self._stop.is_set():
            listed = await self.kubelet.membership()
            state = await proxy.state()
            if listed is not None and state.version == listed.version:
                pairs = serving_pairs(listed)
                self.fewest = pairs if self.fewest is None else min(self.fewest, pairs)
                self.samples += 1
                decodes = [load.inflight for name, load in state.upstreams.items()
                           if name in {u.name for u in listed.decode}]
                if decodes:
                    self.inflight_per_decode.append(sum(decodes) / len(decodes))
            await asyncio.sleep(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()


def instance_names(doc: dict, role: str) -> set[str]:
    name = doc["metadata"]["name"]
    return {f"{name}-{role}-{i}" for i in range(doc["spec"][role].get("replicas", 1))}


def set_paused(doc: dict, paused: bool) -> None:
    for role in ROLES:
        doc["spec"][role].setdefault("rollout", {})["paused"] = paused


def scenario_engine(instance: str, role: str, pod: dict, container: dict) -> FakeEngine:
    engine = plain_engine(instance, role, pod, container)
    engine.pull_s, engine.token_s = (PULL_S, 0.0) if role == "prefill" else (0.0, TOKEN_S)
    return engine


def scenario_doc(scenario: Scenario, namespace: str) -> dict:
    """The scenario's example in `namespace`, its engine pods Ready only once their engine serves."""
    doc = example(scenario.example, namespace=namespace)
    for role in ROLES:
        doc["spec"][role].setdefault("env", []).append({"name": READY_WHEN_SERVING_ENV, "value": "1"})
    return doc


async def run_scenario(cp: ControlPlane, namespace: str, workdir: pathlib.Path,
                       scenario: Scenario) -> Outcome:
    """Deploy the scenario's example in `namespace` (an existing one), wait for it to serve, then
    make its change under load until it rolled out (module docstring)."""
    doc = scenario_doc(scenario, namespace)
    name = doc["metadata"]["name"]
    everything = {role: instance_names(doc, role) for role in ROLES}
    await asyncio.to_thread(create, cp, doc)

    async def status_reads(what: str, check: Callable[[dict], bool]) -> None:
        await status_until(cp, namespace, what, check, name=name)

    def rolled_out(st: dict) -> bool:
        return progressing(st) == ("False", "Complete") and all(
            ((st.get(role) or {}).get("revision") != old[role]) == (role in scenario.rolls)
            and (st.get(role) or {}).get("updatedInstances") == len(everything[role]) for role in ROLES)

    outcome = Outcome()
    async with Kubelet(cp, namespace, name, workdir / scenario.name, scenario_engine) as kubelet:
        await kubelet.routed(everything["prefill"], everything["decode"], TIMEOUT_S)
        before = await asyncio.to_thread(status, cp, namespace, name)
        old = {role: before[role]["revision"] for role in ROLES}
        decodes = doc["spec"]["decode"].get("replicas", 1) + RolloutSpec().max_surge
        sampler = PairSampler(kubelet)
        async with Load((await kubelet.proxy()).url, clients=CLIENTS_PER_DECODE * decodes) as load:
            await load.completed_after(0, COMPLETIONS)
            sampling = asyncio.create_task(sampler.run())
            try:
                if scenario.paused:
                    set_paused(doc, True)
                scenario.change(doc)
                await asyncio.to_thread(apply, cp, doc)
                if scenario.paused:
                    await status_reads("Progressing=Unknown/RolloutPaused",
                                       lambda st: progressing(st) == ("Unknown", "RolloutPaused"))
                    await load.completed_after(load.mark(), COMPLETIONS)  # it serves while paused
                    set_paused(doc, False)
                    await asyncio.to_thread(apply, cp, doc)
                await status_reads("every instance on the new revision and Progressing=Complete", rolled_out)
                await kubelet.routed(everything["prefill"], everything["decode"], TIMEOUT_S)
                await load.completed_after(load.mark(), COMPLETIONS)
            except AssertionError as err:  # counted as a failure: the caller reports every scenario
                outcome.failed.append(f"{scenario.name} did not finish: {err}")
            sampler.stop()
            await sampling
            await load.stop()
        outcome.requests = len(load.started)
        outcome.failed += load.failures + kubelet.errors()
        outcome.fewest_pairs, outcome.samples = sampler.fewest, sampler.samples
        if sampler.inflight_per_decode:
            outcome.inflight_per_decode = statistics.fmean(sampler.inflight_per_decode)
    return outcome


def cleared(cp: ControlPlane, namespace: str) -> None:
    """Delete every PDDeployment and StatefulSet of `namespace` and wait for its pods to go: what
    runs next needs their NPUs (a rollout surges one instance per role)."""
    for path in (f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/pddeployments",
                 f"/apis/apps/v1/namespaces/{namespace}/statefulsets"):
        for obj in cp.api("GET", path)["items"]:
            try:
                cp.api("DELETE", f"{path}/{obj['metadata']['name']}")
            except ApiError as err:
                if err.status != 404:  # a StatefulSet its PDDeployment's deletion took along
                    raise

    async def gone() -> bool:
        return not (await asyncio.to_thread(cp.api, "GET", f"/api/v1/namespaces/{namespace}/pods"))["items"]
    asyncio.run(until(f"every pod of {namespace} gone", gone, TIMEOUT_S, API_POLL_S))

"""The operator scales roles under load without failing a request (issue 18): it drains an instance
before it deletes it.

The GLM example (`glm-flash`: prefill TP8, decode DP2xTP4) runs on kwok nodes whose pods get
loopback IPs, and what its pods would run runs there (support/podnet.py): the real `pd-proxy` in the
proxy pod, watching its membership ConfigMap through the API with its own ServiceAccount (the
mounted file is projected at the start and then only at the kubelet's sync period, so every change
here reaches it through the watch) and reaching the engines by their pods' DNS names, and a fake
engine in each instance's leader pod. So the operator asks the
proxy pod's /pd/state as it would in a cluster, and a few clients send requests through the proxy
pod. Meanwhile `kubectl scale` takes decode 1 -> 2 -> 1 and prefill 1 -> 2 -> 1, and the departing
instance holds a request (decode: a stream after its first token; prefill: a prompt being computed
and a prefilled request whose decode has not pulled its KV yet):
- a new instance gets requests once the ConfigMap lists it and the proxy routes by that version;
- a departing instance keeps its StatefulSet while it carries the held request (status.draining
  names it, across the operator's re-checks), and loses it once released;
- no request fails: a deletion while a request is in flight there would cut it (what ran in a
  deleted pod is killed, and decode pulls the KV from the prefill that computed it);
- a departed instance gets no request begun after the proxy routed by the version without it (by
  request id: the load's requests started after /pd/state first showed that version);
- every membership version after the first reached the proxy through its watch;
- the audit log: the operator's ConfigMap write that drops the instance comes before every DELETE
  of its StatefulSet, pods and headless Service, and every such DELETE after the release.
And a decode instance whose pod fails under load leaves the membership, and no request begun after
the proxy routed by that version reaches it.
Only conditions are waited for (generous deadlines); nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import pathlib
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest
import yaml

from pd_operator.proxy.membership import ProxyState
from support.audit import Event
from support.cluster import DEFAULT_NODES, ControlPlane
from support.fakevllm import FakeEngine, Hold, Load, load_of, until
from support.fixtures import keep_workdir
from support.installed import OperatorProcess, get_pdd, weights_claim
from support.kube import kubectl
from support.podnet import Kubelet, loopback
from support.specs import example

pytestmark = [pytest.mark.integration, pytest.mark.scaling]

GLM = "glm-flash"
P0, P1, D0, D1 = (f"{GLM}-{role}-{i}" for role in ("prefill", "decode") for i in (0, 1))
CLIENTS = 4
TIMEOUT_S = 240.0
RECHECKS = 2
"""The operator's drain re-checks (reconciles it requeues) to wait for while an instance holds a
request after the proxy dropped it."""
HELD_BY = {"decode": "in flight", "prefill": "awaiting decode's KV pull"}
"""What status.draining[].waitingFor says once the operator saw the held request (controller/drain.py)."""


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """This module's own control plane: its nodes hand pods loopback IPs (support/podnet.py)."""
    cp = ControlPlane(nodes=[loopback(DEFAULT_NODES[0])]).start()
    yield cp
    cp.stop(keep=keep_workdir(request))


def from_engine(name: str) -> Callable[[dict], bool]:
    """A decode request whose KV comes from the prefill instance `name`."""
    return lambda body: body["kv_transfer_params"]["remote_engine_id"] == name


@dataclass
class Scenario:
    cp: ControlPlane
    namespace: str
    op: OperatorProcess
    op_user: str
    kubelet: Kubelet
    load: Load

    async def api(self, path: str) -> dict:
        return dict(await asyncio.to_thread(self.cp.api, "GET", path))

    async def kubectl(self, *args: str) -> None:
        await asyncio.to_thread(kubectl, self.cp.kubeconfig, *args, "-n", self.namespace)

    async def statefulset(self, name: str) -> dict | None:
        """The instance's StatefulSet, unless it is gone or being deleted."""
        path = f"/apis/apps/v1/namespaces/{self.namespace}/statefulsets"
        query = urllib.parse.quote(f"metadata.name={name}")
        items = (await self.api(f"{path}?fieldSelector={query}"))["items"]
        return next((s for s in items if not s["metadata"].get("deletionTimestamp")), None)

    async def draining(self) -> dict[str, dict]:
        """status.draining of the PDDeployment, by instance name."""
        pdd = await asyncio.to_thread(get_pdd, self.cp, self.namespace, GLM)
        return {d["name"]: d for d in pdd.get("status", {}).get("draining") or []}

    async def draining_count(self, role: str) -> int:
        """The role's PDRole status.draining (`kubectl get pdr`'s DRAINING)."""
        path = f"/apis/pd.serving.dev/v1alpha1/namespaces/{self.namespace}/pdroles/{GLM}-{role}"
        pdr = await self.api(path)
        return int((pdr.get("status") or {}).get("draining", 0))

    async def rechecks(self) -> float:
        return await asyncio.to_thread(self.op.metric, "pd_operator_reconcile_total", trigger="requeue")

    async def scale(self, role: str, prefill: set[str], decode: set[str]) -> None:
        """`kubectl scale` the role to as many instances as it is to have."""
        count = len(prefill if role == "prefill" else decode)
        await self.kubectl("scale", "pdrole", f"{GLM}-{role}", f"--replicas={count}")

    async def scale_up(self, role: str, instance: str, prefill: set[str], decode: set[str]) -> FakeEngine:
        """`kubectl scale` a role up by one: the new instance is routed to, once Ready, and gets
        requests."""
        scaled = self.cp.audit.mark()
        await self.scale(role, prefill, decode)
        await self.kubelet.routed(prefill, decode)
        engine = await self.kubelet.engine(instance)
        await until(f"{instance} to get a request", lambda: engine.received, TIMEOUT_S)
        # kwok makes a pod Ready (all its containers, kv-link too) in one status write.
        events = self.cp.audit.events(scaled, namespace=self.namespace)
        ready = [i for i, e in enumerate(events) if e.resource == "pods/status" and e.write and e.code < 300
                 and e.name.startswith(f"{instance}-")]
        writes = membership_writes(events, self.op_user)
        assert ready and writes and ready[0] < writes[0], (
            f"{instance} entered the membership ({writes[:1]}) before its pod was Ready ({ready[:1]})")
        return engine


@dataclass
class Drained:
    """What a scale-down showed about its departing instance."""

    instance: str
    engine: FakeEngine
    scaled: int
    """Audit log offset before `kubectl scale`."""
    released: int
    """Audit log offset before the held requests were released."""
    out: ProxyState
    """The proxy's state when it first routed by the version without the instance."""
    load_mark: int
    received_then: int


async def drain(s: Scenario, role: str, engine: FakeEngine, holds: list[Hold],
                prefill: set[str], decode: set[str]) -> Drained:
    """`kubectl scale` a role down to what remains while `holds` keep requests on `engine`: the
    instance stays while they are held, and goes once they are released."""
    instance = engine.name

    async def entry() -> dict | None:
        return (await s.draining()).get(instance)

    async def seen_holding() -> dict | None:
        found = await entry()
        return found if found and HELD_BY[role] in found["waitingFor"] else None

    async def rechecked() -> bool:
        return await s.rechecks() >= seen + RECHECKS

    async def deleted() -> bool:
        return await s.statefulset(instance) is None

    scaled = s.cp.audit.mark()
    await s.scale(role, prefill, decode)
    out = await s.kubelet.routed(prefill, decode)
    load_mark, received_then = s.load.mark(), len(engine.received)
    assert await s.statefulset(instance), f"{instance} deleted by the time the proxy routes without it"
    assert load_of(out, instance) != (0, 0), f"{instance} carries the held requests: {out}"
    # The operator saw the proxy route by the new version and the held request there...
    draining = await until(f"status.draining to say what holds {instance}", seen_holding, TIMEOUT_S)
    assert draining["role"] == role and draining["since"] and draining["deleteBy"], draining
    # ...and keeps the instance across its re-checks while the request is held.
    seen = await s.rechecks()
    await until(f"{RECHECKS} drain re-checks", rechecked, TIMEOUT_S)
    assert await s.statefulset(instance), f"{instance}'s StatefulSet is deleted while it carries a request"
    assert await entry(), f"status.draining no longer names {instance}"
    assert await s.draining_count(role) == 1, f"the {role} PDRole does not count {instance} as draining"
    assert all(h.waiting for h in holds), "the held requests are still held"
    released = s.cp.audit.mark()
    for hold in holds:
        hold.release()
    await until(f"{instance}'s StatefulSet deleted", deleted, TIMEOUT_S)
    await until(f"status.draining without {instance}", lambda: _not(entry()), TIMEOUT_S)
    await until(f"the {role} PDRole draining none", lambda: _zero(s.draining_count(role)), TIMEOUT_S)
    await until(f"the engine of {instance} stopped", lambda: s.kubelet.running(instance) is None, TIMEOUT_S)
    return Drained(instance, engine, scaled, released, out, load_mark, received_then)


async def _not(value: Awaitable[object]) -> bool:
    return not await value


async def _zero(value: Awaitable[int]) -> bool:
    return await value == 0


def _removes(event: Event, instance: str) -> bool:
    """A DELETE of the instance's StatefulSet, headless Service or one of its pods."""
    return event.verb == "delete" and (
        (event.resource in ("statefulsets", "services") and event.name == instance)
        or (event.resource == "pods" and event.name.startswith(f"{instance}-")))


def deletes(cp: ControlPlane, since: int, namespace: str, instance: str) -> list[int]:
    """Positions (in the audit log from `since`) of the DELETEs of the instance's objects."""
    return [i for i, e in enumerate(cp.audit.events(since, namespace=namespace)) if _removes(e, instance)]


def membership_writes(events: list[Event], user: str) -> list[int]:
    """Positions of the operator's writes of the proxy's membership ConfigMap."""
    return [i for i, e in enumerate(events) if e.user == user and e.write and e.resource == "configmaps"
            and e.name == f"{GLM}-proxy" and e.code < 300]


def check_order(cp: ControlPlane, namespace: str, user: str, d: Drained) -> None:
    events = cp.audit.events(d.scaled, namespace=namespace)
    # The membership listed the instance before the scale, and nothing else changed since: the
    # operator's first write of it after the scale is the one that drops the instance.
    writes = membership_writes(events, user)
    removals = deletes(cp, d.scaled, namespace, d.instance)
    assert writes and removals, (d.instance, writes, removals)
    assert writes[0] < removals[0], (
        f"{d.instance}: {events[removals[0]]} before the operator's membership write {events[writes[0]]}")
    assert len(deletes(cp, d.released, namespace, d.instance)) == len(removals), (
        f"{d.instance}: a DELETE while it carried the held requests")


async def _scenario(cp: ControlPlane, namespace: str, op: OperatorProcess, user: str,
                    workdir: pathlib.Path) -> None:
    doc = example(namespace=namespace)
    cp.create_weights_volume(namespace, str(weights_claim(doc)))
    kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc))
    async with Kubelet(cp, namespace, GLM, workdir / "pods") as kubelet:
        load = Load((await kubelet.proxy()).url, clients=CLIENTS)
        s = Scenario(cp, namespace, op, user, kubelet, load)
        await kubelet.routed({P0}, {D0})
        async with load:
            await load.completed_after(0, 10)

            d1 = await s.scale_up("decode", D1, {P0}, {D0, D1})
            streaming = d1.hold("stream")
            await streaming.caught_at_least(1)
            d1_drained = await drain(s, "decode", d1, [streaming], {P0}, {D0})

            p1 = await s.scale_up("prefill", P1, {P0, P1}, {D0})
            pulling = (await kubelet.engine(D0)).hold("answer", match=from_engine(P1))
            await pulling.caught_at_least(1)
            prefilling = p1.hold("answer")
            await prefilling.caught_at_least(1)
            p1_drained = await drain(s, "prefill", p1, [prefilling, pulling], {P0}, {D0})
            await load.completed_after(load.mark(), 10)
            await load.stop()

    assert load.failures == [], load.failures[:10]
    assert kubelet.errors() == []
    sources = kubelet.membership_sources()
    assert len(sources) > 1 and all(s.endswith("(watched)") for s in sources[1:]), sources
    for d in (d1_drained, p1_drained):
        engine = d.engine
        # Nothing begun after the proxy routed by the version without it reached it; at most what
        # was in flight to it then arrived later.
        assert not load.started_after(d.load_mark) & engine.ids, d.instance
        assert len(engine.received) - d.received_then <= load_of(d.out, d.instance)[0], d.instance
        check_order(cp, namespace, user, d)


def test_scaling_under_load_drains_before_it_deletes(control_plane, namespace, release, start_operator,
                                                     tmp_path):
    op = start_operator()
    asyncio.run(_scenario(control_plane, namespace, op, release.user, tmp_path))


async def _failure_scenario(cp: ControlPlane, namespace: str, workdir: pathlib.Path) -> None:
    doc = example(namespace=namespace)
    doc["spec"]["decode"]["replicas"] = 2
    cp.create_weights_volume(namespace, str(weights_claim(doc)))
    kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc))
    async with Kubelet(cp, namespace, GLM, workdir / "pods") as kubelet:
        await kubelet.routed({P0}, {D0, D1})
        d1 = await kubelet.engine(D1)
        async with Load((await kubelet.proxy()).url, clients=CLIENTS) as load:
            await until(f"{D1} to get requests", lambda: len(d1.received) >= 3, TIMEOUT_S)
            await asyncio.to_thread(fail_pod, cp, namespace, f"{D1}-0")
            out = await kubelet.routed({P0}, {D0})
            mark, received_then = load.mark(), len(d1.received)
            await load.completed_after(mark, 20)
            await load.stop()
        assert load.failures == [], load.failures[:10]
        # D1 still runs (its pod is only NotReady): had the proxy kept it, it would get requests.
        assert kubelet.running(D1) is d1
        assert not load.started_after(mark) & d1.ids, sorted(load.started_after(mark) & d1.ids)
        assert len(d1.received) - received_then <= load_of(out, D1)[0]
        sources = kubelet.membership_sources()
        assert sources[1:] and all(s.endswith("(watched)") for s in sources[1:]), sources


def fail_pod(cp: ControlPlane, namespace: str, name: str) -> None:
    """Report the pod NotReady as a kubelet does when its container crashed (kwok leaves it so)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    pod = cp.api("GET", path)
    failed = ("Ready", "ContainersReady")
    pod["status"]["conditions"] = [{**c, "status": "False"} if c["type"] in failed else c
                                   for c in pod["status"]["conditions"]]
    cp.api("PUT", f"{path}/status", pod)


def test_a_failed_decode_gets_no_request_begun_after_the_proxy_dropped_it(control_plane, namespace, release,
                                                                          start_operator, tmp_path):
    """A decode instance whose pod fails under load leaves the membership (controller/gate.py), the
    proxy learns it through its watch, and no request begun after its /pd/state showed that version
    reaches the instance: ordered by request ids and versions, not by time."""
    start_operator()
    asyncio.run(_failure_scenario(control_plane, namespace, tmp_path))

"""Scaling latency on the real control plane: `kubectl scale` of a PDRole until the proxy routes to
the new instance, and until a removed instance is gone, each against a bare StatefulSet scaled in
the same run.

One control plane (tests/support: kube-apiserver v1.36.3, etcd, controller-manager, scheduler, kwok
nodes whose pods get loopback IPs) and the operator as the chart installs it. The GLM example
(`glm-flash`) runs with what its pods would run (support/podnet.py: the real `pd-proxy` in the proxy
pod, fake engines in the instances' leader pods) under a light client load through the proxy pod.
Each repetition, in turn:

1. bare, up: `kubectl scale statefulset` 1 -> 2 until its new pod is Ready;
2. bare, down: 2 -> 1 until that pod is gone;
3. operator, up: `kubectl scale pdrole glm-flash-decode --replicas=2` until the proxy ConfigMap lists
   the new instance and the proxy pod's /pd/state reports that version (it routes to it);
4. operator, down: `--replicas=1` until the instance's StatefulSet is deleted (the operator drains
   it first: the proxy must report the version without it, and nothing may be in flight there).

Medians over the repetitions; `scale_up_routed_vs_bare_ratio` and `scale_down_gone_vs_bare_ratio`
are the operator's over bare's: what routing and draining add to what Kubernetes itself takes.
pd-proxy learns membership by watching its ConfigMap through the API (proxy/watch.py); the emulated
kubelet re-projects the mounted file only at the kubelet's sync period, as a real one does, so
every change reaches the proxy through the watch, as it would on a cluster.

Membership propagation, over every membership change of the run: from the operator's write of the
ConfigMap (the audit log's ResponseComplete time of that write) to the proxy pod's /pd/state first
reporting the new version (polled every PROPAGATION_POLL_S), p50 and p99; against the same from the
write to a plain watch of the ConfigMap in this process (`membership_watch_event_ms_*`): what the
API server itself takes to deliver the event.

`--repetitions N` (default 3). The bench exits 1 when a request failed (PD_BENCH_KEEP=DIR keeps
the logs: tests/support/bench.py).

Figures:
- repetitions: scale-ups and downs of each kind
- bare_scale_up_ready_seconds: bare, 1 -> 2 until the new pod is Ready (median)
- bare_scale_down_gone_seconds: bare, 2 -> 1 until the pod is gone (median)
- operator_scale_up_routed_seconds: operator, 1 -> 2 until the proxy routes to the new instance (median)
- operator_scale_down_gone_seconds: operator, 2 -> 1 until the drained instance is gone (median)
- scale_up_routed_vs_bare_ratio: operator over bare, up
- scale_down_gone_vs_bare_ratio: operator over bare, down
- bare_up_runs_seconds: every repetition's bare scale-up, space-separated
- bare_down_runs_seconds: every repetition's bare scale-down
- operator_up_runs_seconds: every repetition's operator scale-up
- operator_down_runs_seconds: every repetition's operator scale-down
- membership_changes: membership changes measured (operator ConfigMap writes that changed the version)
- membership_propagation_ms_p50: the operator's ConfigMap write -> the proxy pod's /pd/state reports
  the new version (median over the changes)
- membership_propagation_ms_p99: the same, p99
- membership_watch_event_ms_p50: the same write -> a plain watch of the ConfigMap gets it (median)
- membership_watch_event_ms_p99: the same, p99
- membership_propagation_vs_watch_event_p50_ratio: the proxy's median over the plain watch's
- requests: client requests completed through the proxy
- failed_requests: failed requests and the engines' protocol errors
"""

from __future__ import annotations

import asyncio
import datetime
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import _paths  # noqa: F401  (tests/ on sys.path)
import yaml

from pd_operator.proxy.membership import KEY, parse_document
from pd_operator.proxy.watch import CA, NAMESPACE, TOKEN, ApiAccess, ConfigMapWatch
from support import bench
from support.cluster import ControlPlane
from support.fakevllm import Load, ProxyProcess, until
from support.installed import weights_claim
from support.kube import ROOT, kubectl
from support.podnet import API_POLL_S, Kubelet
from support.specs import example

REPETITIONS = 3
QUICK = {"repetitions": 1}
GLM = "glm-flash"
P0, D0, D1 = f"{GLM}-prefill-0", f"{GLM}-decode-0", f"{GLM}-decode-1"
BARE = "bare"
CLIENTS = 2
TIMEOUT_S = 600.0
PROPAGATION_POLL_S = 0.005


def bare_statefulset(namespace: str) -> dict:
    labels = {"app": BARE}
    container = {"name": "pause", "image": "registry.k8s.io/pause:3.10"}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": BARE, "namespace": namespace},
            "spec": {"replicas": 1, "serviceName": BARE, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}}}


@dataclass
class Figures:
    bare_up: list[float] = field(default_factory=list)
    bare_down: list[float] = field(default_factory=list)
    operator_up: list[float] = field(default_factory=list)
    operator_down: list[float] = field(default_factory=list)
    propagation_ms: list[float] = field(default_factory=list)
    """Per membership change: the operator's ConfigMap write -> the proxy reports its version."""
    watch_event_ms: list[float] = field(default_factory=list)
    """The same write -> a plain watch of the ConfigMap gets it."""
    requests: int = 0
    failed: list[str] = field(default_factory=list)
    """Failed requests and the engines' protocol errors."""


class Run:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    async def get(self, path: str) -> dict | None:
        return await asyncio.to_thread(self.cp.find, path)

    async def ready(self, namespace: str) -> bool:
        found = await self.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{BARE}")
        return found is not None and found.get("status", {}).get("readyReplicas") == found["spec"]["replicas"]

    async def timed(self, what: str, act: list[str], namespace: str, done: Callable[[], Awaitable[object]]
                    ) -> float:
        """Seconds from running `kubectl ACT` to `done` holding."""
        started = time.monotonic()
        await asyncio.to_thread(lambda: kubectl(self.cp.kubeconfig, *act, "-n", namespace))
        await until(what, done, TIMEOUT_S, API_POLL_S)
        return time.monotonic() - started

    async def bare(self, namespace: str) -> tuple[float, float]:
        pod = f"/api/v1/namespaces/{namespace}/pods/{BARE}-1"

        async def ready() -> bool:
            found = await self.get(pod)
            return found is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in found.get("status", {}).get("conditions", []))

        async def gone() -> bool:
            return await self.get(pod) is None

        scale = ["scale", "statefulset", BARE]
        up = await self.timed("the bare pod Ready", [*scale, "--replicas=2"], namespace, ready)
        down = await self.timed("the bare pod gone", [*scale, "--replicas=1"], namespace, gone)
        return up, down

    async def operator(self, namespace: str, kubelet: Kubelet) -> tuple[float, float]:
        statefulset = f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{D1}"
        proxy = await kubelet.proxy()

        async def routed() -> bool:
            found = await kubelet.membership()
            return bool(found and D1 in {u.name for u in found.decode}
                        and (await proxy.state()).version == found.version)

        async def gone() -> bool:
            return await self.get(statefulset) is None

        scale = ["scale", "pdrole", f"{GLM}-decode"]
        up = await self.timed("the new decode routed", [*scale, "--replicas=2"], namespace, routed)
        down = await self.timed("the removed decode gone", [*scale, "--replicas=1"], namespace, gone)
        # Its pod gone too (and what ran there stopped) before the next repetition.
        await until("the removed decode's engine stopped", lambda: kubelet.running(D1) is None, TIMEOUT_S)
        return up, down


class Propagation:
    """When the membership version changed, as a plain watch of the ConfigMap saw it and as the
    proxy pod's /pd/state reported it, while inside `async with`."""

    def __init__(self, cp: ControlPlane, namespace: str, proxy: ProxyProcess, workdir: pathlib.Path) -> None:
        credentials = workdir / "bench-watch"
        credentials.mkdir()
        (credentials / TOKEN).write_text(cp.admin_token)
        (credentials / CA).write_bytes(cp.ca_cert.read_bytes())
        (credentials / NAMESPACE).write_text(namespace)
        self.watch = ConfigMapWatch(ApiAccess(cp.server, credentials, namespace), f"{GLM}-proxy", KEY,
                                    self._event)
        self.proxy = proxy
        self.watched: list[tuple[float, str]] = []
        self.routed: list[tuple[float, str]] = []
        self._tasks: list[asyncio.Task] = []

    def _event(self, data: bytes | None, source: str, why: str) -> None:
        if data is not None:
            changed(self.watched, parse_document(json.loads(data)).version)

    async def _poll(self) -> None:
        while True:
            version = (await self.proxy.state()).version
            if version is not None:
                changed(self.routed, version)
            await asyncio.sleep(PROPAGATION_POLL_S)

    async def __aenter__(self) -> Propagation:
        self._tasks = [asyncio.create_task(self.watch.run()), asyncio.create_task(self._poll())]
        await until("the plain watch listed the ConfigMap", lambda: self.watched, TIMEOUT_S)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def figures(self, writes: list[float]) -> tuple[list[float], list[float]]:
        """(write -> proxy, write -> plain watch) in ms for each change after the first list: its
        write is the last one that completed before the plain watch got it, and the proxy's time the
        first report of that version after the write."""
        proxy_ms, watch_ms = [], []
        for seen, version in self.watched[1:]:
            written = max((w for w in writes if w <= seen), default=None)
            if written is None:
                continue
            routed = min((t for t, v in self.routed if v == version and t >= written), default=None)
            if routed is None:
                continue
            proxy_ms.append((routed - written) * 1000)
            watch_ms.append((seen - written) * 1000)
        return proxy_ms, watch_ms


def changed(history: list[tuple[float, str]], version: str) -> None:
    """Record `version` now if it is not the last one recorded."""
    if not history or history[-1][1] != version:
        history.append((time.time(), version))


def membership_writes(cp: ControlPlane, namespace: str, user: str) -> list[float]:
    """When each of the operator's writes of the proxy ConfigMap completed (epoch seconds)."""
    events = cp.audit.events(0, user=user, namespace=namespace, resource="configmaps")
    return sorted(datetime.datetime.fromisoformat(e.raw["stageTimestamp"]).timestamp() for e in events
                  if e.write and e.name == f"{GLM}-proxy" and e.code < 300)


async def measure(cp: ControlPlane, workdir: pathlib.Path, repetitions: int, user: str) -> Figures:
    run = Run(cp)
    bare_ns, operator_ns = "bench-bare", "bench-operator"
    for namespace in (bare_ns, operator_ns):
        cp.create_namespace(namespace)
    cp.api("POST", f"/apis/apps/v1/namespaces/{bare_ns}/statefulsets", bare_statefulset(bare_ns))
    doc = example(ROOT / "examples" / "glm-5.3-flash-tp8-dp2tp4.yaml", operator_ns)
    cp.create_weights_volume(operator_ns, str(weights_claim(doc)))
    kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc))
    figures = Figures()
    await until("the bare StatefulSet ready", lambda: run.ready(bare_ns), TIMEOUT_S, API_POLL_S)
    async with Kubelet(cp, operator_ns, GLM, workdir / "pods") as kubelet:
        await kubelet.routed({P0}, {D0}, TIMEOUT_S)
        proxy = await kubelet.proxy()
        async with Load(proxy.url, clients=CLIENTS) as load, \
                Propagation(cp, operator_ns, proxy, workdir) as propagation:
            await load.completed_after(0, 10)
            for _ in range(repetitions):
                up, down = await run.bare(bare_ns)
                figures.bare_up.append(up)
                figures.bare_down.append(down)
                up, down = await run.operator(operator_ns, kubelet)
                figures.operator_up.append(up)
                figures.operator_down.append(down)
            await load.stop()
        figures.propagation_ms, figures.watch_event_ms = propagation.figures(
            await asyncio.to_thread(membership_writes, cp, operator_ns, user))
        figures.requests = len(load.completed)
        figures.failed = load.failures + kubelet.errors()
    return figures


def percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99), the nearest rank; NaN for no values."""
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench.parser(__doc__, (REPETITIONS, "scale-ups and downs of each kind"))
    repetitions = bench.parse(parser, argv, QUICK).repetitions
    with bench.workdir("pd-bench-") as workdir, bench.operator_plane(workdir) as (cp, release):
        result = asyncio.run(measure(cp, workdir, repetitions, release.user))
        print(f"# kubernetes {cp.api('GET', '/version')['gitVersion']}")
    medians = {k: statistics.median(getattr(result, k))
               for k in ("bare_up", "bare_down", "operator_up", "operator_down")}
    if not result.propagation_ms:
        result.failed.append("no membership change was measured")
    proxy_p, watch_p = percentiles(result.propagation_ms), percentiles(result.watch_event_ms)
    bench.report(__doc__, {
        "repetitions": repetitions,
        "bare_scale_up_ready_seconds": f"{medians['bare_up']:.2f}",
        "bare_scale_down_gone_seconds": f"{medians['bare_down']:.2f}",
        "operator_scale_up_routed_seconds": f"{medians['operator_up']:.2f}",
        "operator_scale_down_gone_seconds": f"{medians['operator_down']:.2f}",
        "scale_up_routed_vs_bare_ratio": f"{medians['operator_up'] / medians['bare_up']:.2f}",
        "scale_down_gone_vs_bare_ratio": f"{medians['operator_down'] / medians['bare_down']:.2f}",
        **{f"{key}_runs_seconds": " ".join(f"{v:.2f}" for v in getattr(result, key)) for key in medians},
        "membership_changes": len(result.propagation_ms),
        "membership_propagation_ms_p50": f"{proxy_p[0]:.1f}",
        "membership_propagation_ms_p99": f"{proxy_p[1]:.1f}",
        "membership_watch_event_ms_p50": f"{watch_p[0]:.1f}",
        "membership_watch_event_ms_p99": f"{watch_p[1]:.1f}",
        "membership_propagation_vs_watch_event_p50_ratio": f"{proxy_p[0] / max(watch_p[0], 0.1):.2f}",
        "requests": result.requests,
        "failed_requests": len(result.failed),
    })
    return bench.exit_code(result.failed)


if __name__ == "__main__":
    sys.exit(main())

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
Here the emulated kubelet projects a changed ConfigMap within SYNC_S (0.2 s) and pd-proxy reads its
file every second; a real kubelet takes up to its sync period plus its ConfigMap cache TTL (about a
minute by default), which adds to both operator figures on a cluster.

`--repetitions N` (default 3). The bench exits 1 when a request failed.

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
- requests: client requests completed through the proxy
- failed_requests: failed requests and the engines' protocol errors
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import _paths  # noqa: F401  (tests/ on sys.path)
import yaml

from support import bench
from support.cluster import DEFAULT_NODES, ControlPlane
from support.fakevllm import Load, until
from support.installed import helm_install, helm_uninstall, weights_claim
from support.kube import ROOT, kubectl
from support.podnet import API_POLL_S, Kubelet, loopback
from support.specs import example

REPETITIONS = 3
QUICK = {"repetitions": 1}
GLM = "glm-flash"
P0, D0, D1 = f"{GLM}-prefill-0", f"{GLM}-decode-0", f"{GLM}-decode-1"
BARE = "bare"
CLIENTS = 2
TIMEOUT_S = 600.0


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


async def measure(cp: ControlPlane, workdir: pathlib.Path, repetitions: int) -> Figures:
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
        async with Load((await kubelet.proxy()).url, clients=CLIENTS) as load:
            await load.completed_after(0, 10)
            for _ in range(repetitions):
                up, down = await run.bare(bare_ns)
                figures.bare_up.append(up)
                figures.bare_down.append(down)
                up, down = await run.operator(operator_ns, kubelet)
                figures.operator_up.append(up)
                figures.operator_down.append(down)
            await load.stop()
        figures.requests = len(load.completed)
        figures.failed = load.failures + kubelet.errors()
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench.parser(__doc__)
    parser.add_argument("--repetitions", type=int, default=REPETITIONS,
                        help=f"scale-ups and downs of each kind (default {REPETITIONS})")
    repetitions = bench.parse(parser, argv, QUICK).repetitions
    with tempfile.TemporaryDirectory(prefix="pd-bench-") as tmp, \
            ControlPlane(nodes=[loopback(DEFAULT_NODES[0])]) as cp:
        workdir = pathlib.Path(tmp)
        release = helm_install(cp, workdir)
        try:
            with release.operator(cp, workdir) as op:
                op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "the webhook configured")
                result = asyncio.run(measure(cp, workdir, repetitions))
        finally:
            helm_uninstall(cp, release)
        print(f"# kubernetes {cp.api('GET', '/version')['gitVersion']}")
    medians = {k: statistics.median(getattr(result, k))
               for k in ("bare_up", "bare_down", "operator_up", "operator_down")}
    bench.report(__doc__, {
        "repetitions": repetitions,
        "bare_scale_up_ready_seconds": f"{medians['bare_up']:.2f}",
        "bare_scale_down_gone_seconds": f"{medians['bare_down']:.2f}",
        "operator_scale_up_routed_seconds": f"{medians['operator_up']:.2f}",
        "operator_scale_down_gone_seconds": f"{medians['operator_down']:.2f}",
        "scale_up_routed_vs_bare_ratio": f"{medians['operator_up'] / medians['bare_up']:.2f}",
        "scale_down_gone_vs_bare_ratio": f"{medians['operator_down'] / medians['bare_down']:.2f}",
        **{f"{key}_runs_seconds": " ".join(f"{v:.2f}" for v in getattr(result, key)) for key in medians},
        "requests": result.requests,
        "failed_requests": len(result.failed),
    })
    for failure in result.failed[:10]:
        print(f"  {failure}", file=sys.stderr)
    return 0 if not result.failed else 1


if __name__ == "__main__":
    sys.exit(main())

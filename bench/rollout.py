"""Rolling updates on the real control plane under client load: an image change rolled through 2
prefill and 2 decode instances against a bare StatefulSet `RollingUpdate` of the same pod count in
the same run, and the rollouts of issue 32 that must fail no request.

One control plane (tests/support: kube-apiserver v1.36.3, etcd, controller-manager, scheduler, kwok
nodes whose pods get loopback IPs) and the operator as the chart installs it. The GLM example with
2 + 2 instances (one pod each) runs with what its pods would run (support/podnet.py: the real
`pd-proxy`, fake engines in the instances' leader pods) under a client load through the proxy pod
for the whole run. Each repetition, in turn:

1. bare: a 4-pod StatefulSet's image changes (RollingUpdate, the default: one pod at a time,
   highest ordinal first) until every pod runs the update revision and is Ready;
2. operator: the PDDeployment's image changes (the default rollout: one surge instance per role,
   none unavailable) until every instance runs the new revision, Progressing=Complete, and the
   proxy routes to all four again. A surge instance comes up first, and each instance leaves the
   proxy and drains before its pods go, which bare skips: the ratio is what serving through the
   change costs.

Medians over the repetitions; `rollout_vs_bare_ratio` is the operator's over bare's. pd-proxy
watches its membership ConfigMap through the API, as on a cluster. Fake engines load at once, so
neither figure has a model load in it (on NPUs that dominates both alike).

Then the scenarios of support/rollout_scenarios.py (SCENARIOS), one after the other, each a
PDDeployment of its own that must fail no request under a load keeping 2 requests in flight per
decode instance, a KV transfer in flight when a prefill drains, and engine pods Ready
only once their engine serves: default_1p1d (the 1P1D example's default rollout of an env change
on both roles), layout_change (decode TP4 -> TP2), decode_block (decode's block size alone: decode
rolls, prefill keeps its revision), pods_per_instance (the GLM example's decode DP2 -> DP4) and
paused_resumed (the env change applied paused, then resumed). Each prints its
failed requests, the requests it sent, the fewest serving prefill/decode pairs (per KV layout, the
fewer of its members) in a sample of the membership the proxy routed by, and the requests in
flight per decode member (the proxy's `/pd/state`, the mean over the samples).

`--repetitions N` (default 2). The bench exits 1 when a request failed (PD_BENCH_KEEP=DIR keeps
the logs: tests/support/bench.py).

Figures:
- repetitions: image changes of each kind
- bare_rollout_seconds: bare, the image change until every pod is updated and Ready (median)
- operator_rollout_seconds: operator, the image change until every instance is updated and routed (median)
- rollout_vs_bare_ratio: operator over bare
- bare_runs_seconds: every repetition's bare rollout, space-separated
- operator_runs_seconds: every repetition's operator rollout
- requests: client requests completed through the proxy
- rollout_failed_requests: failed requests and the engines' protocol errors
- default_1p1d_failed_requests: default_1p1d, failed requests and the engines' protocol errors
- default_1p1d_requests: default_1p1d, requests sent
- default_1p1d_min_serving_pairs: default_1p1d, the fewest serving prefill/decode pairs in a sample
- default_1p1d_inflight_per_decode: default_1p1d, requests in flight per decode member (mean)
- layout_change_failed_requests: layout_change, failed requests and protocol errors
- layout_change_requests: layout_change, requests sent
- layout_change_min_serving_pairs: layout_change, the fewest serving pairs in a sample
- layout_change_inflight_per_decode: layout_change, requests in flight per decode member (mean)
- decode_block_failed_requests: decode_block, failed requests and protocol errors
- decode_block_requests: decode_block, requests sent
- decode_block_min_serving_pairs: decode_block, the fewest serving pairs in a sample (per layout they pair as)
- decode_block_inflight_per_decode: decode_block, requests in flight per decode member (mean)
- pods_per_instance_failed_requests: pods_per_instance, failed requests and protocol errors
- pods_per_instance_requests: pods_per_instance, requests sent
- pods_per_instance_min_serving_pairs: pods_per_instance, the fewest serving pairs in a sample
- pods_per_instance_inflight_per_decode: pods_per_instance, requests in flight per decode member (mean)
- paused_resumed_failed_requests: paused_resumed, failed requests and protocol errors
- paused_resumed_requests: paused_resumed, requests sent
- paused_resumed_min_serving_pairs: paused_resumed, the fewest serving pairs in a sample
- paused_resumed_inflight_per_decode: paused_resumed, requests in flight per decode member (mean)
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import _paths  # noqa: F401  (tests/ on sys.path)

from pd_operator.api.types import ROLES
from support import bench
from support.cluster import ControlPlane
from support.fakevllm import Load, until
from support.podnet import API_POLL_S, Kubelet
from support.rollout import GLM, INSTANCES, NEW_IMAGE, TIMEOUT_S, apply, create, rolled, status, two_by_two
from support.rollout_scenarios import SCENARIOS, Outcome, Scenario, cleared, run_scenario

REPETITIONS = 2
QUICK = {"repetitions": 1}
BARE = "bare"
PODS = 4
CLIENTS = 2
NAMESPACES = ("bench-bare", "bench-operator")
"""The image-change measurement's (bare, operator)."""
BARE_IMAGES = ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.9")


def bare_statefulset(namespace: str) -> dict:
    labels = {"app": BARE}
    container = {"name": "pause", "image": BARE_IMAGES[0]}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": BARE, "namespace": namespace},
            "spec": {"replicas": PODS, "serviceName": BARE, "selector": {"matchLabels": labels},
                     "updateStrategy": {"type": "RollingUpdate"},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}}}


@dataclass
class Figures:
    bare: list[float] = field(default_factory=list)
    operator: list[float] = field(default_factory=list)
    requests: int = 0
    failed: list[str] = field(default_factory=list)


async def bare_rollout(cp: ControlPlane, namespace: str, image: str) -> float:
    path = f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{BARE}"

    async def rolled_out() -> bool:
        st = (await asyncio.to_thread(cp.api, "GET", path)).get("status") or {}
        return (st.get("updateRevision") == st.get("currentRevision") and st.get("updatedReplicas") == PODS
                and st.get("readyReplicas") == PODS and st.get("observedGeneration", 0) >= generation)

    change = {"spec": {"template": {"spec": {"containers": [{"name": "pause", "image": image}]}}}}
    started = time.monotonic()
    generation = (await asyncio.to_thread(cp.api, "PATCH", path, change,
                                          content_type="application/strategic-merge-patch+json"))["metadata"]["generation"]
    await until("the bare StatefulSet rolled out", rolled_out, TIMEOUT_S, API_POLL_S)
    return time.monotonic() - started


async def operator_rollout(cp: ControlPlane, namespace: str, doc: dict, image: str,
                           kubelet: Kubelet) -> float:
    old = {role: status(cp, namespace)[role]["revision"] for role in ROLES}
    started = time.monotonic()
    doc["spec"]["image"]["name"] = image
    await asyncio.to_thread(apply, cp, doc)
    check = rolled(old)
    await until("every instance on the new revision and Progressing=Complete",
                lambda: asyncio.to_thread(lambda: check(status(cp, namespace))), TIMEOUT_S, API_POLL_S)
    await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"], TIMEOUT_S)
    return time.monotonic() - started


async def measure(cp: ControlPlane, workdir: pathlib.Path, repetitions: int) -> Figures:
    bare_ns, operator_ns = NAMESPACES
    for namespace in (bare_ns, operator_ns):
        cp.create_namespace(namespace)
    cp.api("POST", f"/apis/apps/v1/namespaces/{bare_ns}/statefulsets", bare_statefulset(bare_ns))
    doc = two_by_two(operator_ns)
    images = (doc["spec"]["image"]["name"], NEW_IMAGE)
    create(cp, doc)
    figures = Figures()
    async with Kubelet(cp, operator_ns, GLM, workdir / "pods") as kubelet:
        await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"], TIMEOUT_S)
        async with Load((await kubelet.proxy()).url, clients=CLIENTS) as load:
            await load.completed_after(0, 10)
            for k in range(repetitions):
                figures.bare.append(await bare_rollout(cp, bare_ns, BARE_IMAGES[(k + 1) % 2]))
                figures.operator.append(await operator_rollout(cp, operator_ns, doc, images[(k + 1) % 2],
                                                               kubelet))
            await load.completed_after(load.mark(), 10)
            await load.stop()
        figures.requests = len(load.completed)
        figures.failed = load.failures + kubelet.errors()
    return figures


def scenario_namespace(scenario: Scenario) -> str:
    return f"bench-{scenario.name.replace('_', '-')}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench.parser(__doc__, (REPETITIONS, "image changes of each kind"))
    repetitions = bench.parse(parser, argv, QUICK).repetitions
    with bench.workdir("pd-bench-") as workdir, bench.operator_plane(workdir) as (cp, release):
        result = asyncio.run(measure(cp, workdir, repetitions))
        scenarios: dict[str, Outcome] = {}
        for namespace in NAMESPACES:
            cleared(cp, namespace)
        for scenario in SCENARIOS:
            namespace = scenario_namespace(scenario)
            cp.create_namespace(namespace)
            scenarios[scenario.name] = asyncio.run(run_scenario(cp, namespace, workdir, scenario))
            cleared(cp, namespace)
        print(f"# kubernetes {cp.api('GET', '/version')['gitVersion']}")
    bare, operator = statistics.median(result.bare), statistics.median(result.operator)
    bench.report(__doc__, {
        "repetitions": repetitions,
        "bare_rollout_seconds": f"{bare:.2f}",
        "operator_rollout_seconds": f"{operator:.2f}",
        "rollout_vs_bare_ratio": f"{operator / bare:.2f}",
        "bare_runs_seconds": " ".join(f"{v:.2f}" for v in result.bare),
        "operator_runs_seconds": " ".join(f"{v:.2f}" for v in result.operator),
        "requests": result.requests,
        "rollout_failed_requests": len(result.failed),
        **{figure: value for name, o in scenarios.items() for figure, value in (
            (f"{name}_failed_requests", len(o.failed)), (f"{name}_requests", o.requests),
            (f"{name}_min_serving_pairs", o.fewest_pairs if o.fewest_pairs is not None else "nan"),
            (f"{name}_inflight_per_decode",
             f"{o.inflight_per_decode:.2f}" if o.inflight_per_decode is not None else "nan"))},
    })
    return bench.exit_code(result.failed + [f for o in scenarios.values() for f in o.failed])


if __name__ == "__main__":
    sys.exit(main())

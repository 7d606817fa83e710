"""Reconcile cost on the real control plane: N GLM-5.3-Flash 1P1D PDDeployments to all Ready with
the operator as the chart installs it, against the same rendered children applied without it.

One control plane (tests/support: kube-apiserver v1.36.3, etcd, controller-manager, scheduler,
kwok nodes with 8 NPUs each, enough for every pod) serves both runs, one after the other:

1. The floor: the children the operator would render for the N deployments (PDRoles among them,
   so the chart's CRDs go in first, as `helm install` would create them), applied with
   `kubectl apply --server-side` (one call), until every StatefulSet and Deployment has all its
   replicas Ready (the StatefulSet controller, the scheduler and kwok do the work). Then deleted.
2. The operator (`helm install`, the chart's command as its ServiceAccount): the N PDDeployments
   created, until every one reports Ready=True. `operator_vs_bare_ratio` is its time over the
   floor's: what the operator adds on top of what Kubernetes itself needs.

From the API server's audit log: the operator's requests and writes per object; its writes during
a drift pass over every object once all is Ready (`writes_per_noop_reconcile`, target 0: the bench
exits 1 otherwise). The operator's resident memory at the end. Admission: --concurrency (20)
parallel `kubectl apply --dry-run=server` of valid manifests (--rounds, 5 rounds), the API server's
own latency for each from the audit log (received to answered, the webhook call included) as
p50/p99, against the same for a ConfigMap (no webhook) in the same run.

`--objects N` (default 100) sets the scale.

Figures:
- objects: PDDeployments
- bare_seconds_to_all_ready: the floor
- operator_seconds_to_all_ready: with the operator
- operator_vs_bare_ratio: the second over the first
- requests_per_object: the operator's API requests until all Ready, per PDDeployment
- writes_per_object: the writes among them
- noop_reconciles: reconciles in the drift pass
- writes_per_noop_reconcile: the operator's writes in that pass, per reconcile
- operator_rss_mb: the operator's resident memory at the end
- admission_concurrency: parallel dry runs
- admission_pdd_server_p50_ms: the API server's latency for a PDDeployment (the webhook's call in it)
- admission_pdd_server_p99_ms: its p99
- admission_pdd_kubectl_p50_ms: the same measured around kubectl
- admission_pdd_kubectl_p99_ms: its p99
- admission_configmap_server_p50_ms: the API server's latency for a ConfigMap (no webhook)
- admission_configmap_server_p99_ms: its p99
- admission_configmap_kubectl_p50_ms: the same measured around kubectl
- admission_configmap_kubectl_p99_ms: its p99
- admission_pdd_vs_configmap_p50_ratio: admission_pdd_server_p50_ms over the ConfigMap's
"""

from __future__ import annotations

import concurrent.futures
import datetime
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Sequence

import _paths  # noqa: F401  (tests/ on sys.path)
import yaml

from pd_operator.render import render
from support import bench
from support.audit import Event
from support.cluster import ControlPlane, wait_for
from support.fleet import RECONCILES, conditions, fleet_doc, fleet_nodes, metric, pdd_path, rss_mb
from support.installed import OperatorProcess, helm_install, helm_uninstall, install_crds, weights_claim
from support.kube import kubectl
from support.specs import resolve

OBJECTS = 100
CONCURRENT = 20
ROUNDS = 5
DRIFT_S = 10.0
TIMEOUT_S = 1800.0
QUICK = {"objects": 2, "concurrency": 4, "rounds": 1, "drift_interval": 2.0}


def _workloads_ready(cp: ControlPlane, namespace: str, want: int) -> bool:
    ready = 0
    for plural in ("statefulsets", "deployments"):
        for obj in cp.api("GET", f"/apis/apps/v1/namespaces/{namespace}/{plural}")["items"]:
            replicas = obj["spec"].get("replicas", 1)
            ready += (obj.get("status") or {}).get("readyReplicas", 0) == replicas
    return ready == want


def _docs(count: int, namespace: str) -> list[dict]:
    return [fleet_doc(i, namespace, prefix="glm") for i in range(count)]


def bare(cp: ControlPlane, count: int, workdir: pathlib.Path) -> float:
    """Seconds from `kubectl apply --server-side` of every rendered child to all workloads Ready."""
    namespace = "bench-bare"
    install_crds(cp)
    cp.create_namespace(namespace)
    cp.create_weights_volume(namespace, str(weights_claim(fleet_doc(0, namespace))))
    manifests = [m for doc in _docs(count, namespace) for m in render(resolve(doc))]
    workloads = sum(m["kind"] in ("StatefulSet", "Deployment") for m in manifests)
    path = workdir / "bare.yaml"
    path.write_text(yaml.safe_dump_all(manifests))
    started = time.monotonic()
    kubectl(cp.kubeconfig, "apply", "--server-side", "--field-manager=bench", "-f", str(path),
            timeout=TIMEOUT_S)
    wait_for("bare workloads Ready", lambda: _workloads_ready(cp, namespace, workloads), TIMEOUT_S,
             interval=0.5)
    seconds = time.monotonic() - started
    cp.delete_namespace(namespace)
    # Its pods hold the NPUs the operator's run needs.
    pods = f"/api/v1/namespaces/{namespace}/pods"
    wait_for("the bare run's pods gone", lambda: not cp.api("GET", pods)["items"], TIMEOUT_S, interval=1.0)
    return seconds


def operator_run(cp: ControlPlane, op: OperatorProcess, user: str, count: int) -> dict[str, float]:
    namespace = "bench-operator"
    cp.create_namespace(namespace)
    cp.create_weights_volume(namespace, str(weights_claim(fleet_doc(0, namespace))))
    docs = _docs(count, namespace)
    mark = cp.audit.mark()
    started = time.monotonic()
    for doc in docs:
        cp.api("POST", pdd_path(namespace), doc)

    def all_ready() -> bool:
        items = cp.api("GET", pdd_path(namespace))["items"]
        return len(items) == count and all(conditions(o).get("Ready", ("",))[0] == "True" for o in items)

    wait_for("every PDDeployment Ready", all_ready, TIMEOUT_S, interval=0.5)
    seconds = time.monotonic() - started
    mine = cp.audit.events(mark, user=user)
    # A drift pass over every object once all is Ready: each reconcile finds nothing to change.
    noop_mark, runs = cp.audit.mark(), metric(op, RECONCILES)
    wait_for("a drift pass over all", lambda: metric(op, RECONCILES) >= runs + count, TIMEOUT_S, interval=0.5)
    noop_runs = metric(op, RECONCILES) - runs
    noop_writes = [e for e in cp.audit.events(noop_mark, user=user) if e.write]
    return {"seconds": seconds, "requests": len(mine), "writes": sum(e.write for e in mine),
            "noop_writes": len(noop_writes), "noop_runs": noop_runs, "rss_mb": rss_mb(op.process.pid)}


def _server_latency_ms(event: Event) -> float:
    def at(key: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(str(event.raw[key]).replace("Z", "+00:00"))
    return (at("stageTimestamp") - at("requestReceivedTimestamp")).total_seconds() * 1000


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _timed_dry_run(cp: ControlPlane, path: pathlib.Path) -> float:
    started = time.monotonic()
    kubectl(cp.kubeconfig, "apply", "--dry-run=server", "-f", str(path))
    return (time.monotonic() - started) * 1000


def admission(cp: ControlPlane, workdir: pathlib.Path, concurrency: int, rounds: int) -> dict[str, float]:
    """`concurrency` parallel `kubectl apply --dry-run=server`, `rounds` times, of a valid
    PDDeployment and of a ConfigMap; the API server's latency of each create from the audit log."""
    namespace = "bench-admission"
    cp.create_namespace(namespace)
    pdd = workdir / "pdd.yaml"
    pdd.write_text(yaml.safe_dump(fleet_doc(0, namespace, prefix="dry")))
    configmap = workdir / "configmap.yaml"
    configmap.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": "dry", "namespace": namespace}, "data": {}}))
    out: dict[str, float] = {}
    for label, path, resource in (("pdd", pdd, "pddeployments"), ("configmap", configmap, "configmaps")):
        mark = cp.audit.mark()
        client: list[float] = []
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            for _ in range(rounds):
                client += list(pool.map(lambda _, path=path: _timed_dry_run(cp, path), range(concurrency)))
        server = [_server_latency_ms(e) for e in cp.audit.events(mark, resource=resource, namespace=namespace)
                  if e.verb in ("create", "patch")]
        assert len(server) >= concurrency * rounds, f"{len(server)} audit events for {label}"
        out[f"{label}_server_p50"] = statistics.median(server)
        out[f"{label}_server_p99"] = _percentile(server, 0.99)
        out[f"{label}_kubectl_p50"] = statistics.median(client)
        out[f"{label}_kubectl_p99"] = _percentile(client, 0.99)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench.parser(__doc__)
    parser.add_argument("--objects", type=int, default=OBJECTS, help=f"PDDeployments (default {OBJECTS})")
    parser.add_argument("--concurrency", type=int, default=CONCURRENT,
                        help=f"parallel admission dry runs (default {CONCURRENT})")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of them (default {ROUNDS})")
    parser.add_argument("--drift-interval", type=float, default=DRIFT_S,
                        help=f"the operator's drift interval, s (default {DRIFT_S:.0f})")
    args = bench.parse(parser, argv, QUICK)
    count = args.objects
    with bench.workdir("pd-bench-") as workdir, ControlPlane(nodes=fleet_nodes(count)) as cp:
        floor_s = bare(cp, count, workdir)
        release = helm_install(cp, workdir)
        try:
            with release.operator(cp, workdir, extra_args=[f"--drift-interval={args.drift_interval}"]) as op:
                op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "the webhook configured")
                run = operator_run(cp, op, release.user, count)
                latency = admission(cp, workdir, args.concurrency, args.rounds)
        finally:
            helm_uninstall(cp, release)
        print(f"# kubernetes {cp.api('GET', '/version')['gitVersion']}")
    bench.report(__doc__, {
        "objects": count,
        "bare_seconds_to_all_ready": f"{floor_s:.2f}",
        "operator_seconds_to_all_ready": f"{run['seconds']:.2f}",
        "operator_vs_bare_ratio": f"{run['seconds'] / floor_s:.3f}",
        "requests_per_object": f"{run['requests'] / count:.1f}",
        "writes_per_object": f"{run['writes'] / count:.1f}",
        "noop_reconciles": f"{run['noop_runs']:.0f}",
        "writes_per_noop_reconcile": f"{run['noop_writes'] / run['noop_runs']:.3f}",
        "operator_rss_mb": f"{run['rss_mb']:.1f}",
        "admission_concurrency": args.concurrency,
        **{f"admission_{key}_ms": f"{value:.1f}" for key, value in latency.items()},
        "admission_pdd_vs_configmap_p50_ratio":
            f"{latency['pdd_server_p50'] / latency['configmap_server_p50']:.2f}",
    })
    return 0 if run["noop_writes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Reconcile cost on the real control plane: N copies of the GLM-5.3-Flash P TP8 -> D DP2xTP4
example created with the operator as the chart installs it (webhook on), against the same rendered
children applied without it, in the same run.

One control plane (tests/support: kube-apiserver v1.36.3, etcd, controller-manager, scheduler,
kwok nodes with 8 NPUs each, enough for every pod) serves both runs, one after the other:

1. The floor: the children the operator would render for the N deployments (PDRoles among them,
   so the chart's CRDs go in first, as `helm install` would create them), applied with one
   `kubectl apply --server-side`: present when that command returns; then until every
   StatefulSet and Deployment has all its replicas Ready (the StatefulSet controller, the
   scheduler and kwok do the work). Then deleted.
2. The operator (`helm install`, the chart's command as its ServiceAccount): the N PDDeployments
   created one after the other (each through the webhook), each followed by a ConfigMap's create
   (no webhook: the API server's own latency under the same load; sent from another thread, so
   that it does not delay the next PDDeployment), from the first create until
   the API server has answered the operator's write of the last of their children (the audit log),
   then until every PDDeployment reports Ready=True.

From the API server's audit log: the operator's requests until all Ready per child, the
PDDeployment creates' own latency (the webhook's call in it, beside the operator's reconciles), and
the operator's writes during a drift pass over every object once all is Ready
(`writes_per_noop_reconcile`, target 0: the bench exits 1 otherwise). From /proc: the operator's
CPU time over the run per reconcile it ran, and its resident memory at the end (both with its
webhook process's). Admission at rest:
--concurrency (20) parallel `kubectl apply --dry-run=server` of valid manifests (--rounds, 5
rounds), the API server's own latency for each (received to answered, the webhook call included)
as p50/p99, against the same for a ConfigMap (no webhook) in the same run. Before the figures, as
`#` lines: the operator's requests until all Ready by verb, resource and answer, with the API
server's median latency for each.

`--objects N` (default 100) sets the scale.

Figures:
- objects: PDDeployments
- children: the children they render, in all
- bare_seconds_to_present: `kubectl apply --server-side` of every child, start to return
- operator_seconds_to_present: the first PDDeployment create to the operator's last child written
- operator_vs_bare_present_ratio: the second over the first (issue 35's target: 1.2)
- bare_seconds_to_all_ready: the floor, to every workload Ready
- operator_seconds_to_all_ready: with the operator, to every PDDeployment Ready
- operator_vs_bare_ratio: the second over the first
- api_requests_per_child: the operator's API requests until all Ready, per child
- api_writes_per_child: the writes among them
- reconciles_per_object: the operator's reconciles until all Ready, per PDDeployment
- cpu_seconds_per_reconcile: the operator's CPU time (its webhook process's included) until all
  Ready over those reconciles
- create_burst_seconds: from the first PDDeployment create to the last's answer (the reconciles of
  the first ones write meanwhile: a longer burst meets more of their load)
- create_server_p50_ms: the API server's latency for the run's PDDeployment creates (the webhook's call in it)
- create_server_p99_ms: its p99
- create_configmap_server_p50_ms: the API server's latency for the ConfigMap created after each (no webhook)
- create_configmap_server_p99_ms: its p99
- create_pdd_vs_configmap_p50_ratio: create_server_p50_ms over create_configmap_server_p50_ms
- noop_reconciles: reconciles in the drift pass
- writes_per_noop_reconcile: the operator's writes in that pass, per reconcile
- operator_rss_mb: the operator's resident memory at the end (its webhook process's included)
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

import collections
import concurrent.futures
import copy
import datetime
import math
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Sequence

import _paths  # noqa: F401  (tests/ on sys.path)
import yaml

from pd_operator.render import render
from pd_operator.render.kinds import resource_of
from pd_operator.render.yaml_text import to_yaml
from support import bench
from support.audit import Event
from support.cluster import ControlPlane, wait_for
from support.fleet import RECONCILES, conditions, fleet_nodes, metric, pdd_path, rss_mb
from support.installed import OperatorProcess, helm_install, helm_uninstall, install_crds, weights_claim
from support.kube import ROOT, kubectl
from support.specs import resolve

EXAMPLE = ROOT / "examples" / "glm-5.3-flash-tp8-dp2tp4.yaml"
NPUS_PER_OBJECT = 16  # prefill TP8 on one node, decode DP2 x TP4 on another
OBJECTS = 100
CONCURRENT = 20
ROUNDS = 5
DRIFT_S = 10.0
TIMEOUT_S = 1800.0
QUICK = {"objects": 2, "concurrency": 4, "rounds": 1, "drift_interval": 2.0}
BESIDE = "beside-"
"""The name prefix of the ConfigMaps created beside the PDDeployments."""
Child = tuple[str, str]
"""(resource, name) of a child in the run's namespace."""


def _workloads_ready(cp: ControlPlane, namespace: str, want: int) -> bool:
    ready = 0
    for plural in ("statefulsets", "deployments"):
        for obj in cp.api("GET", f"/apis/apps/v1/namespaces/{namespace}/{plural}")["items"]:
            replicas = obj["spec"].get("replicas", 1)
            ready += (obj.get("status") or {}).get("readyReplicas", 0) == replicas
    return ready == want


def _docs(count: int, namespace: str) -> list[dict]:
    example = yaml.safe_load(EXAMPLE.read_text())
    docs = []
    for i in range(count):
        doc = copy.deepcopy(example)
        doc["metadata"] = {"name": f"glm-{i:03d}", "namespace": namespace}
        docs.append(doc)
    return docs


def _namespace(cp: ControlPlane, namespace: str, doc: dict) -> None:
    """The namespace with what the example asks to create first: its weights claim and API key."""
    cp.create_namespace(namespace)
    cp.create_weights_volume(namespace, str(weights_claim(doc)))
    key = doc["spec"]["proxy"]["apiKey"]["name"]
    cp.api("POST", f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": key}, "stringData": {"api-key": "bench"}})


def _children(docs: list[dict]) -> list[dict]:
    return [m for doc in docs for m in render(resolve(doc))]


def _at(event: Event, key: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(str(event.raw[key]).replace("Z", "+00:00"))


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command (the state first)."""
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _tree(pid: int) -> list[int]:
    """A process and its children (the operator's webhook process), from /proc (Linux)."""
    children = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    children.append(int(entry.name))
            except (OSError, IndexError):  # ended meanwhile
                continue
    return [pid, *children]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children so far (Linux /proc)."""
    return sum(int(_stat(p)[11]) + int(_stat(p)[12]) for p in _tree(pid)) / os.sysconf("SC_CLK_TCK")


def bare(cp: ControlPlane, count: int, workdir: pathlib.Path) -> tuple[float, float]:
    """Seconds from `kubectl apply --server-side` of every rendered child to its return (every child
    present) and to all workloads Ready."""
    namespace = "bench-bare"
    install_crds(cp)
    docs = _docs(count, namespace)
    _namespace(cp, namespace, docs[0])
    manifests = _children(docs)
    workloads = sum(m["kind"] in ("StatefulSet", "Deployment") for m in manifests)
    path = workdir / "bare.yaml"
    path.write_text(to_yaml(manifests))
    started = time.monotonic()
    kubectl(cp.kubeconfig, "apply", "--server-side", "--field-manager=bench", "-f", str(path),
            timeout=TIMEOUT_S)
    present = time.monotonic() - started
    wait_for("bare workloads Ready", lambda: _workloads_ready(cp, namespace, workloads), TIMEOUT_S,
             interval=0.5)
    ready = time.monotonic() - started
    cp.delete_namespace(namespace)
    # Its pods hold the NPUs the operator's run needs.
    pods = f"/api/v1/namespaces/{namespace}/pods"
    wait_for("the bare run's pods gone", lambda: not cp.api("GET", pods)["items"], TIMEOUT_S, interval=1.0)
    return present, ready


def _last_child_written(events: list[Event], children: set[Child]) -> datetime.datetime:
    """When the API server answered the first successful write of the last of `children`."""
    written: dict[Child, datetime.datetime] = {}
    for event in events:
        child = (event.resource, event.name)
        if event.verb in ("create", "patch") and 200 <= event.code < 300 and child in children:
            written.setdefault(child, _at(event, "stageTimestamp"))
    if missing := children - set(written):
        raise SystemExit(f"the operator wrote no {sorted(missing)[:5]} ({len(missing)} children)")
    return max(written.values())


def operator_run(cp: ControlPlane, op: OperatorProcess, user: str, count: int) -> dict[str, float]:
    namespace = "bench-operator"
    docs = _docs(count, namespace)
    _namespace(cp, namespace, docs[0])
    children = {(resource_of(m), m["metadata"]["name"]) for m in _children(docs)}
    pid = op.process.pid
    mark, runs, cpu = cp.audit.mark(), metric(op, RECONCILES), _cpu_seconds(pid)
    started_at = datetime.datetime.now(datetime.UTC)
    started = time.monotonic()
    # The ConfigMaps from a thread of their own: they must not delay the next PDDeployment's create.
    with concurrent.futures.ThreadPoolExecutor(1) as beside:
        for doc in docs:
            cp.api("POST", pdd_path(namespace), doc)
            beside.submit(cp.api, "POST", f"/api/v1/namespaces/{namespace}/configmaps", {
                "apiVersion": "v1", "kind": "ConfigMap", "data": {},
                "metadata": {"name": f"{BESIDE}{doc['metadata']['name']}"}})
        burst = time.monotonic() - started

    def all_ready() -> bool:
        items = cp.api("GET", pdd_path(namespace))["items"]
        return len(items) == count and all(conditions(o).get("Ready", ("",))[0] == "True" for o in items)

    wait_for("every PDDeployment Ready", all_ready, TIMEOUT_S, interval=0.5)
    seconds = time.monotonic() - started
    reconciles, cpu = metric(op, RECONCILES) - runs, _cpu_seconds(pid) - cpu
    everything = cp.audit.events(mark, namespace=namespace)
    mine = [e for e in everything if e.user == user]
    creates = [_server_latency_ms(e) for e in everything
               if e.resource == "pddeployments" and e.verb == "create" and e.user != user]
    beside = [_server_latency_ms(e) for e in everything if e.resource == "configmaps"
              and e.verb == "create" and e.user != user and e.name.startswith(BESIDE)]
    present = (_last_child_written(mine, children) - started_at).total_seconds()
    by_request = collections.Counter((e.verb, e.resource, e.code) for e in mine)
    for (verb, resource, code), n in by_request.most_common():
        latency = statistics.median(_server_latency_ms(e) for e in mine if (e.verb, e.resource, e.code)
                                    == (verb, resource, code))
        print(f"# operator requests: {n} {verb} {resource} -> {code}, server p50 {latency:.0f} ms")
    # A drift pass over every object once all is Ready: each reconcile finds nothing to change.
    noop_mark, runs = cp.audit.mark(), metric(op, RECONCILES)
    wait_for("a drift pass over all", lambda: metric(op, RECONCILES) >= runs + count, TIMEOUT_S, interval=0.5)
    noop_runs = metric(op, RECONCILES) - runs
    noop_writes = [e for e in cp.audit.events(noop_mark, user=user) if e.write]
    for event in noop_writes[:10]:
        print(f"# a write in the drift pass: {event}")
    return {"present": present, "seconds": seconds, "children": len(children), "requests": len(mine),
            "writes": sum(e.write for e in mine), "reconciles": reconciles, "cpu": cpu,
            "burst": burst,
            "create_p50": statistics.median(creates), "create_p99": _percentile(creates, 0.99),
            "beside_p50": statistics.median(beside), "beside_p99": _percentile(beside, 0.99),
            "noop_writes": len(noop_writes), "noop_runs": noop_runs, "rss_mb": sum(map(rss_mb, _tree(pid)))}


def _server_latency_ms(event: Event) -> float:
    return (_at(event, "stageTimestamp") - _at(event, "requestReceivedTimestamp")).total_seconds() * 1000


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
    (doc,) = _docs(1, namespace)
    doc["metadata"]["name"] = "dry"
    pdd.write_text(yaml.safe_dump(doc))
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
    nodes = fleet_nodes(count, NPUS_PER_OBJECT)
    with bench.workdir("pd-bench-") as workdir, ControlPlane(nodes=nodes) as cp:
        floor_present, floor_ready = bare(cp, count, workdir)
        release = helm_install(cp, workdir)
        try:
            with release.operator(cp, workdir, extra_args=[f"--drift-interval={args.drift_interval}"]) as op:
                op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "the webhook configured")
                run = operator_run(cp, op, release.user, count)
                latency = admission(cp, workdir, args.concurrency, args.rounds)
        finally:
            helm_uninstall(cp, release)
        print(f"# kubernetes {cp.api('GET', '/version')['gitVersion']}, load {os.getloadavg()[0]:.1f}")
    bench.report(__doc__, {
        "objects": count,
        "children": run["children"],
        "bare_seconds_to_present": f"{floor_present:.2f}",
        "operator_seconds_to_present": f"{run['present']:.2f}",
        "operator_vs_bare_present_ratio": f"{run['present'] / floor_present:.3f}",
        "bare_seconds_to_all_ready": f"{floor_ready:.2f}",
        "operator_seconds_to_all_ready": f"{run['seconds']:.2f}",
        "operator_vs_bare_ratio": f"{run['seconds'] / floor_ready:.3f}",
        "api_requests_per_child": f"{run['requests'] / run['children']:.2f}",
        "api_writes_per_child": f"{run['writes'] / run['children']:.2f}",
        "reconciles_per_object": f"{run['reconciles'] / count:.1f}",
        "cpu_seconds_per_reconcile": f"{run['cpu'] / run['reconciles']:.4f}",
        "create_burst_seconds": f"{run['burst']:.2f}",
        "create_server_p50_ms": f"{run['create_p50']:.1f}",
        "create_server_p99_ms": f"{run['create_p99']:.1f}",
        "create_configmap_server_p50_ms": f"{run['beside_p50']:.1f}",
        "create_configmap_server_p99_ms": f"{run['beside_p99']:.1f}",
        "create_pdd_vs_configmap_p50_ratio": f"{run['create_p50'] / run['beside_p50']:.2f}",
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

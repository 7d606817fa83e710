"""Soak: the real operator (`python -m pd_operator run`, its own process) reconciling many
PDDeployments in the emulated API server for a long time while a share of API calls fail, with
spec changes and pods turning Ready throughout. Prints one `name: value` line per figure.

The baseline is the same operator's own memory right after the fleet first converged, measured in
this run: `rss_growth_ratio` is its resident memory at the end over that. `errors` are the
reconciles that failed (pd_operator_reconcile_errors_total: mostly the injected faults, retried),
`unhandled_exceptions` the operator's log records that carry a traceback plus a crash of the process; both
should stay at 0 for the second and grow only with faults for the first.

Defaults are the issue's: 200 PDDeployments, 10 minutes, 5% faults. The emulated API server bounds
how fast the fleet first converges (see bench/reconcile.py), so large fleets take a while to start.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import yaml

from pd_operator.devcluster import DevCluster
from pd_operator.devcluster.patching import MERGE_PATCH
from pd_operator.localnet import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "pd.serving.dev_pddeployments.yaml"
EXAMPLE = ROOT / "examples" / "glm-5.3-flash-1p1d-tp4.yaml"
API = "pd.serving.dev/v1alpha1"
NS = "default"
ERRORS = "pd_operator_reconcile_errors_total"


def rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def metric(port: int, prefix: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def ready(obj: dict | None) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in ((obj or {}).get("status") or {}).get("conditions", []))


def kubelets(cluster: DevCluster, stop: threading.Event) -> None:
    """Pods turn Ready a moment after they appear, as engines would once loaded."""
    while not stop.wait(0.5):
        for pod in cluster.list("v1", "Pod", NS):
            if not ready(pod):
                cluster.set_pod_ready(NS, pod["metadata"]["name"], True)


def churn(cluster: DevCluster, names: list[str], every_s: float, stop: threading.Event) -> None:
    """Every `every_s`, scale one random deployment's decode between 1 and 2 instances (a hand
    edit through the store, so the faults hit only the operator)."""
    rng = random.Random(1)
    rt = cluster.store.find_type(API, "PDDeployment")
    while not stop.wait(every_s):
        name = rng.choice(names)
        current = cluster.get(API, "PDDeployment", NS, name)["spec"]["decode"]["replicas"]
        cluster.store.patch(rt, NS, name, MERGE_PATCH, {"spec": {"decode": {"replicas": 3 - current}}})


def unhandled(log_path: pathlib.Path) -> list[str]:
    out = []
    for line in log_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            out.append(line)  # not the JSON logger: a crash printed by the interpreter
            continue
        if "exception" in record or record.get("logger") == "asyncio":
            out.append(record["message"])
    return out


def wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=200, help="PDDeployments (default 200)")
    parser.add_argument("--minutes", type=float, default=10.0, help="soak duration (default 10)")
    parser.add_argument("--fault-rate", type=float, default=0.05, help="share of API calls failing (0.05)")
    parser.add_argument("--drift-interval", type=float, default=10.0, help="operator drift interval, s")
    parser.add_argument("--churn-interval", type=float, default=5.0, help="seconds between spec changes")
    parser.add_argument("--settle-timeout", type=float, default=1800.0,
                        help="how long the fleet may take to first become Ready (s)")
    args = parser.parse_args(argv)

    doc = yaml.safe_load(EXAMPLE.read_text())
    names = [f"soak-{i:03d}" for i in range(args.objects)]
    with DevCluster(crd_paths=[str(CRD)]) as cluster, tempfile.TemporaryDirectory() as work:
        cluster.run_workload_controllers(pod_ready=False)
        log_path = pathlib.Path(work) / "operator.log"
        metrics_port = free_port()
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pd_operator", "run", "--no-webhook", "--log-format=json",
                 f"--kubeconfig={cluster.kubeconfig_path}", f"--health-port={free_port()}",
                 f"--metrics-port={metrics_port}", f"--drift-interval={args.drift_interval}"],
                stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()
        threads = [threading.Thread(target=kubelets, args=(cluster, stop), daemon=True)]
        try:
            threads[0].start()
            cluster.faults.configure(rate=args.fault_rate, kinds=["500", "drop"], seed=5)
            started = time.monotonic()
            for name in names:
                obj = copy.deepcopy(doc)
                obj["metadata"]["name"] = name
                cluster.create(obj)
            settled = wait(lambda: sum(ready(o) for o in cluster.list(API, "PDDeployment", NS)) == len(names),
                           args.settle_timeout)
            settle_s = time.monotonic() - started
            rss_start = rss_mb(proc.pid)
            requests0, errors0 = len(cluster.requests), metric(metrics_port, ERRORS)
            threads.append(threading.Thread(target=churn, args=(cluster, names, args.churn_interval, stop),
                                            daemon=True))
            threads[1].start()
            soak_start = time.monotonic()
            while time.monotonic() - soak_start < args.minutes * 60 and proc.poll() is None:
                time.sleep(1.0)
            minutes = (time.monotonic() - soak_start) / 60
            crashed = proc.poll() is not None
            rss_end = rss_mb(proc.pid) if not crashed else float("nan")
            requests = len(cluster.requests) - requests0
            errors = metric(metrics_port, ERRORS) - errors0 if not crashed else -1
            ready_end = sum(ready(o) for o in cluster.list(API, "PDDeployment", NS))
            injected = sum(cluster.faults.injected.values())
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=10)
            proc.terminate()
            proc.wait(timeout=30)
        problems = unhandled(log_path) + (["the operator process exited"] if crashed else [])

    print(f"objects: {args.objects}")
    print(f"fault_rate: {args.fault_rate}")
    print(f"settled: {int(settled)}")
    print(f"seconds_to_first_all_ready: {settle_s:.1f}")
    print(f"soak_minutes: {minutes:.2f}")
    print(f"rss_start_mb: {rss_start:.1f}")
    print(f"rss_end_mb: {rss_end:.1f}")
    print(f"rss_growth_ratio: {rss_end / rss_start:.3f}")
    print(f"requests_per_minute: {requests / minutes:.0f}")
    print(f"faults_injected: {injected}")
    print(f"errors: {errors:.0f}")
    print(f"unhandled_exceptions: {len(problems)}")
    print(f"ready_at_end: {ready_end}")
    for text in problems[:5]:
        print(f"# unhandled: {text[:300]}", file=sys.stderr)
    return 0 if not problems and settled else 1


if __name__ == "__main__":
    sys.exit(main())

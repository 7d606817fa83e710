"""Reconcile cost at scale: 100 GLM-5.3-Flash PDDeployments in the emulated API server, with the
real operator (`python -m pd_operator run`, in its own process as in a cluster, so the emulator and
the operator do not share one interpreter lock). Prints one `name: value` line per figure.

The baseline is one PDDeployment reaching Ready in a fresh cluster in the same run; the ratio
compares 100 objects with 100 times that. `writes_per_noop_reconcile` counts the API writes of
drift reconciles once everything is Ready (target 0: an unchanged object costs reads only).

`--objects N` (default 100) sets the scale. Measured on a 2-core machine: 10 objects ~3 s,
20 objects ~3.5 s, 100 objects ~13-20 s to all Ready (~30-40 s for the whole run). Until the
emulator stopped scanning kmock's request history per request and deep-copying every listed
object, it bounded the time (20 objects ~115 s); `operator_cpu_share` shows who uses the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import os
import pathlib
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import yaml

from pd_operator.devcluster import DevCluster
from pd_operator.localnet import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "pd.serving.dev_pddeployments.yaml"
EXAMPLE = ROOT / "examples" / "glm-5.3-flash-tp8-dp2tp4.yaml"
API = "pd.serving.dev/v1alpha1"
OBJECTS = 100
DRIFT_S = 2.0
TIMEOUT_S = 300.0


def _is_true(obj: dict | None, kind: str) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def _kubelets(cluster: DevCluster, stop: threading.Event) -> None:
    """Mark new pods Ready shortly after they appear, as kubelets would once engines load."""
    while not stop.wait(0.2):
        for pod in cluster.list("v1", "Pod", "default"):
            if not _is_true(pod, "Ready"):
                cluster.set_pod_ready("default", pod["metadata"]["name"], True)


@contextlib.contextmanager
def _operator(cluster: DevCluster, metrics_port: int) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "pd_operator", "run", "--no-webhook", "--log-format=json",
                             f"--kubeconfig={cluster.kubeconfig_path}", f"--health-port={free_port()}",
                             f"--metrics-port={metrics_port}", f"--drift-interval={DRIFT_S}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: _reconciles(metrics_port) is not None, "the operator's metrics endpoint")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _reconciles(metrics_port: int) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("pd_operator_reconcile_total{"))


def _wait(predicate: Callable[[], object], what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > TIMEOUT_S:
            raise TimeoutError(what)
        time.sleep(0.1)
    return time.monotonic() - start


def run(count: int) -> dict[str, float]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    with DevCluster(crd_paths=[str(CRD)]) as cluster:
        cluster.run_workload_controllers(pod_ready=False)
        metrics_port = free_port()
        stop = threading.Event()
        kubelets = threading.Thread(target=_kubelets, args=(cluster, stop), daemon=True)
        with _operator(cluster, metrics_port) as proc:
            kubelets.start()
            before = len(cluster.requests)
            emulator_cpu0 = _cpu_seconds(os.getpid())
            start = time.monotonic()
            for i in range(count):
                obj = copy.deepcopy(doc)
                obj["metadata"]["name"] = f"glm-{i}"
                cluster.create(obj)
            _wait(lambda: all(_is_true(o, "Ready") for o in cluster.list(API, "PDDeployment", "default"))
                  and len(cluster.list(API, "PDDeployment", "default")) == count, "all Ready")
            seconds = time.monotonic() - start
            operator_cpu = _cpu_seconds(proc.pid)
            emulator_cpu = _cpu_seconds(os.getpid()) - emulator_cpu0
            requests = len(cluster.requests) - before
            writes = cluster.requests.count_writes()
            time.sleep(DRIFT_S)  # let the last child events settle
            writes0, runs0 = cluster.requests.count_writes(), _reconciles(metrics_port) or 0.0
            _wait(lambda: (_reconciles(metrics_port) or 0.0) >= runs0 + count, "a drift pass over all")
            noop_writes = cluster.requests.count_writes() - writes0
            noop_runs = (_reconciles(metrics_port) or 0.0) - runs0
            stop.set()
            kubelets.join()
    return {"seconds": seconds, "requests_per_object": requests / count, "writes_per_object": writes / count,
            "writes_per_noop_reconcile": noop_writes / noop_runs,
            "operator_cpu_share": operator_cpu / (operator_cpu + emulator_cpu)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=OBJECTS, help=f"PDDeployments (default {OBJECTS})")
    count = parser.parse_args(argv).objects
    logging.basicConfig(level=logging.ERROR)
    one = run(1)
    many = run(count)
    print(f"objects: {count}")
    print(f"seconds_to_one_ready: {one['seconds']:.2f}")
    print(f"seconds_to_all_ready: {many['seconds']:.2f}")
    print(f"all_ready_vs_{count}x_one_ratio: {many['seconds'] / (count * one['seconds']):.3f}")
    print(f"requests_per_object: {many['requests_per_object']:.1f}")
    print(f"requests_per_object_vs_one_ratio: {many['requests_per_object'] / one['requests_per_object']:.2f}")
    print(f"writes_per_object: {many['writes_per_object']:.1f}")
    print(f"writes_per_noop_reconcile: {many['writes_per_noop_reconcile']:.3f}")
    # The CPU the operator process used until all Ready, as a share of operator + emulator CPU.
    print(f"operator_cpu_share: {many['operator_cpu_share']:.3f}")
    return 0 if many["writes_per_noop_reconcile"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

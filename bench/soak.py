"""Soak on the real control plane: the operator as the chart installs it (its command, its
ServiceAccount) reconciling many PDDeployments for a long time while a share of its API calls fail
(500s and dropped connections from a FaultProxy in front of kube-apiserver, seeded), with spec
changes throughout and kwok running the pods.

The baseline is the same operator's own memory right after the fleet first became Ready, measured
in this run: `rss_growth_ratio` is its resident memory at the end over that. `errors` are the
reconciles that failed (pd_operator_reconcile_errors_total: mostly the injected faults, retried),
`unhandled_exceptions` the operator's log records that carry a traceback plus a crash of the
process; the second should stay at 0, the first grow only with faults.

Defaults are the issue's: 200 PDDeployments, 10 minutes, 5% faults. The bench exits 1 when the
fleet never became Ready or an exception went unhandled.

Figures:
- objects: PDDeployments
- fault_rate: the share of the operator's API calls failing
- settled: 1 when the fleet first became all Ready within --settle-timeout, else 0
- seconds_to_first_all_ready: from the first create to that
- soak_minutes: how long the soak ran after that
- rss_start_mb: the operator's resident memory then (the baseline)
- rss_end_mb: its resident memory at the end
- rss_growth_ratio: the second over the first
- requests_per_minute: the operator's API requests during the soak
- faults_injected: the faults the proxy injected during the soak
- errors: reconciles that failed during the soak
- unhandled_exceptions: log records with a traceback, plus a crash
- ready_at_end: PDDeployments Ready at the end
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Sequence

import _paths  # noqa: F401  (tests/ on sys.path)

from support import bench
from support.cluster import ControlPlane, wait_for
from support.faultproxy import FaultProxy
from support.fleet import conditions, fleet_doc, fleet_nodes, merge_patch, metric, pdd_path, rss_mb
from support.installed import helm_install, helm_uninstall, weights_claim

NAMESPACE = "soak"
ERRORS = "pd_operator_reconcile_errors_total"
NPUS_PER_OBJECT = 12  # the 1P1D TP4 example with decode scaled up to 2 instances
QUICK = {"objects": 3, "minutes": 0.25, "drift_interval": 2.0, "churn_interval": 2.0, "settle_timeout": 300.0}


def ready_count(cp: ControlPlane) -> int:
    return sum(conditions(o).get("Ready", ("",))[0] == "True"
               for o in cp.api("GET", pdd_path(NAMESPACE))["items"])


def churn(cp: ControlPlane, names: list[str], every_s: float, stop: threading.Event) -> None:
    """Every `every_s`, scale one random deployment's decode between 1 and 2 instances (as admin,
    so the faults hit only the operator)."""
    rng = random.Random(1)
    while not stop.wait(every_s):
        name = rng.choice(names)
        current = cp.api("GET", pdd_path(NAMESPACE, name))["spec"]["decode"]["replicas"]
        merge_patch(cp, pdd_path(NAMESPACE, name), {"spec": {"decode": {"replicas": 3 - current}}})


def unhandled(log: str) -> list[str]:
    out = []
    for line in log.splitlines():
        if line.startswith("--- start "):  # the launcher's header (support.cluster.Component)
            continue
        try:
            record = json.loads(line)
        except ValueError:
            out.append(line)  # not the JSON logger: a crash printed by the interpreter
            continue
        if "exception" in record or record.get("logger") == "asyncio":
            out.append(record["message"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench.parser(__doc__)
    parser.add_argument("--objects", type=int, default=200, help="PDDeployments (default 200)")
    parser.add_argument("--minutes", type=float, default=10.0, help="soak duration (default 10)")
    parser.add_argument("--fault-rate", type=float, default=0.05, help="share of API calls failing (0.05)")
    parser.add_argument("--drift-interval", type=float, default=10.0, help="operator drift interval, s")
    parser.add_argument("--churn-interval", type=float, default=5.0, help="seconds between spec changes")
    parser.add_argument("--settle-timeout", type=float, default=1800.0,
                        help="how long the fleet may take to first become Ready (s)")
    args = bench.parse(parser, argv, QUICK)

    names = [f"soak-{i:03d}" for i in range(args.objects)]
    nodes = fleet_nodes(args.objects, NPUS_PER_OBJECT)
    with bench.workdir("pd-soak-") as workdir, ControlPlane(nodes=nodes) as cp, \
            FaultProxy(cp) as proxy:
        cp.create_namespace(NAMESPACE)
        cp.create_weights_volume(NAMESPACE, str(weights_claim(fleet_doc(0, NAMESPACE))))
        release = helm_install(cp, workdir, values=["webhook.enabled=false"])
        stop = threading.Event()
        churner = threading.Thread(target=churn, args=(cp, names, args.churn_interval, stop), daemon=True)
        try:
            # Half of the faults answered 500, half a connection dropped before anything is forwarded.
            half = args.fault_rate / 2
            errors_rule = proxy.inject(status=500, probability=half, times=None, seed=5)
            drops_rule = proxy.inject(drop=True, probability=half / (1 - half), times=None, seed=6)
            with release.operator(cp, workdir, server=proxy.url,
                                  extra_args=[f"--drift-interval={args.drift_interval}"]) as op:
                assert op.process is not None
                started = time.monotonic()
                for i in range(len(names)):
                    cp.api("POST", pdd_path(NAMESPACE), fleet_doc(i, NAMESPACE, prefix="soak"))
                try:
                    wait_for("the fleet Ready", lambda: ready_count(cp) == len(names), args.settle_timeout,
                             interval=1.0)
                    settled = True
                except TimeoutError:
                    settled = False
                settle_s = time.monotonic() - started
                rss_start = rss_mb(op.process.pid)
                requests0, errors0 = len(proxy.requests), metric(op, ERRORS)
                churner.start()
                soak_start = time.monotonic()
                while time.monotonic() - soak_start < args.minutes * 60 and op.running():
                    time.sleep(1.0)
                minutes = (time.monotonic() - soak_start) / 60
                crashed = not op.running()
                rss_end = rss_mb(op.process.pid) if not crashed else float("nan")
                requests = len(proxy.requests) - requests0
                errors = metric(op, ERRORS) - errors0 if not crashed else -1
                stop.set()
                churner.join(timeout=30)
                ready_end = ready_count(cp)
                injected = errors_rule.hits + drops_rule.hits
                log = op.output()
        finally:
            stop.set()
            helm_uninstall(cp, release)
    problems = unhandled(log) + (["the operator process exited"] if crashed else [])

    bench.report(__doc__, {
        "objects": args.objects,
        "fault_rate": args.fault_rate,
        "settled": int(settled),
        "seconds_to_first_all_ready": f"{settle_s:.1f}",
        "soak_minutes": f"{minutes:.2f}",
        "rss_start_mb": f"{rss_start:.1f}",
        "rss_end_mb": f"{rss_end:.1f}",
        "rss_growth_ratio": f"{rss_end / rss_start:.3f}",
        "requests_per_minute": f"{requests / minutes:.0f}",
        "faults_injected": injected,
        "errors": f"{errors:.0f}",
        "unhandled_exceptions": len(problems),
        "ready_at_end": ready_end,
    })
    for text in problems[:5]:
        print(f"# unhandled: {text[:300]}", file=sys.stderr)
    return 0 if not problems and settled else 1


if __name__ == "__main__":
    sys.exit(main())

"""Prometheus metrics of the operator, in a registry of its own (one per operator run)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("pd_operator_reconcile_total", "Reconciles run, by trigger and result",
                                  ["trigger", "result"], registry=self.registry)
        self.duration = Histogram("pd_operator_reconcile_duration_seconds", "Time one reconcile takes",
                                  registry=self.registry,
                                  buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.errors = Counter("pd_operator_reconcile_errors_total",
                              "Failed reconciles by kind: invalid_spec, api_temporary, api_permanent",
                              ["kind"], registry=self.registry)
        self.ready = Gauge("pd_operator_pddeployment_ready", "1 when the PDDeployment's Ready condition "
                           "is True", ["namespace", "name"], registry=self.registry)
        self.kv_compatible = Gauge("pd_operator_pddeployment_kv_compatible", "1 when prefill and decode "
                                   "KV layouts are compatible", ["namespace", "name"], registry=self.registry)

    def observe(self, namespace: str, name: str, ready: bool, kv_compatible: bool) -> None:
        self.ready.labels(namespace, name).set(1 if ready else 0)
        self.kv_compatible.labels(namespace, name).set(1 if kv_compatible else 0)

    def forget(self, namespace: str, name: str) -> None:
        for gauge in (self.ready, self.kv_compatible):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)

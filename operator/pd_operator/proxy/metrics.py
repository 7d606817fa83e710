"""pd-proxy's Prometheus metrics: one registry per proxy, served on its own port (--metrics-port)
without the admin token, so a scraper needs neither the clients' key nor the admin one (the
NetworkPolicy admits the chart's metrics.scrapers to it, render/policy.py).

Every series, its labels and what one request adds to it are in SERIES (docs/architecture.md lists
them; tests/security/test_proxy_metrics.py checks each against the requests it sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pd_operator.proxy.membership import ProxyState
from pd_operator.proxy.prefix_routing import PrefixRouter

METRICS_PATH = "/metrics"
PREFIX = "pd_proxy"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

OUTCOMES = ("ok", "invalid", "unauthorized", "overloaded", "no_upstream", "upstream_error",
            "upstream_timeout")
"""A request's outcome, from its answer: 2xx ok; 401 unauthorized; another 4xx invalid (the client's
fault, an engine's 4xx included); 503 with Retry-After overloaded (a bound of the proxy); 503
without it no_upstream; 504 upstream_timeout; any other 5xx upstream_error."""

SERIES = {
    f"{PREFIX}_requests_total": "counter {path, outcome}: requests answered on the clients' port (OUTCOMES; "
                                "path: /v1/completions, /v1/chat/completions, /v1/models or other)",
    f"{PREFIX}_time_to_first_token_seconds": "histogram {path}: from the request's arrival to decode's "
                                             "first byte (its first token)",
    f"{PREFIX}_request_duration_seconds": "histogram {path}: from the request's arrival to the end of "
                                          "its answer, completions only",
    f"{PREFIX}_kv_hop_seconds": "histogram: from prefill's answer to decode's first byte (decode pulls "
                                "the KV in between)",
    f"{PREFIX}_upstream_inflight": "gauge {role, upstream}: calls in flight per member (as /pd/state)",
    f"{PREFIX}_upstream_awaiting_decode": "gauge {upstream}: requests a prefill member finished whose "
                                          "decode has not sent its first byte",
    f"{PREFIX}_retries_total": "counter {role}: attempts after a call's first, per role",
    f"{PREFIX}_reprefills_total": "counter: requests prefilled again after a decode that may have "
                                  "pulled the KV failed",
    f"{PREFIX}_prefix_index_blocks": "gauge {holder}: blocks the prefix index expects a prefill member "
                                     "(approximate) or one DP rank of it (precise: `<member>/dp<rank>`) to "
                                     "hold",
    f"{PREFIX}_kv_events_resyncs_total": "counter {holder}: precise routing, times a publisher's KV "
                                         "events broke their sequence or did not decode, so what the index "
                                         "held for it was cleared (from 0 again when the member's feed is "
                                         "renewed: it left, or its layout changed)",
}


def outcome(status: int, retry_after: bool) -> str:
    if status < 400:
        return "ok"
    if status == 401:
        return "unauthorized"
    if status < 500:
        return "invalid"
    if status == 503:
        return "overloaded" if retry_after else "no_upstream"
    return "upstream_timeout" if status == 504 else "upstream_error"


class _Load(Collector):
    """The per-member gauges, read from the balancer's state at scrape time."""

    def __init__(self, state: Callable[[], ProxyState]) -> None:
        self.state = state

    def collect(self) -> Iterable[GaugeMetricFamily]:
        inflight = GaugeMetricFamily(f"{PREFIX}_upstream_inflight", "Calls in flight per member",
                                     labels=["role", "upstream"])
        awaiting = GaugeMetricFamily(f"{PREFIX}_upstream_awaiting_decode", "Requests a prefill member "
                                     "finished whose decode has not sent its first byte", labels=["upstream"])
        for name, load in sorted(self.state().upstreams.items()):
            inflight.add_metric([load.role, name], load.inflight)
            if load.role == "prefill":
                awaiting.add_metric([name], load.awaiting_decode)
        yield inflight
        yield awaiting


class _Prefix(Collector):
    """The prefix index's figures, read from the router at scrape time."""

    def __init__(self, router: Callable[[], PrefixRouter]) -> None:
        self.router = router

    def collect(self) -> Iterable[Metric]:
        router = self.router()
        blocks = GaugeMetricFamily(f"{PREFIX}_prefix_index_blocks", "Blocks the prefix index expects a "
                                   "holder to hold", labels=["holder"])
        for holder in router.index.holders():
            blocks.add_metric([holder], router.index.size(holder))
        resyncs = CounterMetricFamily(f"{PREFIX}_kv_events_resyncs", "Times a publisher's KV events were "
                                      "resynced", labels=["holder"])
        for feed in sorted(router.feeds.values(), key=lambda f: f.holder):
            resyncs.add_metric([feed.holder], feed.resyncs)
        yield blocks
        yield resyncs


@dataclass
class Timing:
    """One request's clock: when its head arrived, when a prefill last answered it."""

    path: str
    arrived: float
    prefilled: float = 0.0


class ProxyMetrics:
    def __init__(self, state: Callable[[], ProxyState], router: Callable[[], PrefixRouter]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Requests answered on the clients' port",
                                ["path", "outcome"], registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "From a request's arrival to "
                              "decode's first byte", ["path"], buckets=LATENCY_BUCKETS, registry=r)
        self.duration = Histogram(f"{PREFIX}_request_duration_seconds", "From a request's arrival to the "
                                  "end of its answer", ["path"], buckets=LATENCY_BUCKETS, registry=r)
        self.kv_hop = Histogram(f"{PREFIX}_kv_hop_seconds", "From prefill's answer to decode's first byte",
                                buckets=HOP_BUCKETS, registry=r)
        self.retries = Counter(f"{PREFIX}_retries", "Attempts after a call's first", ["role"], registry=r)
        self.reprefills = Counter(f"{PREFIX}_reprefills", "Requests prefilled again", registry=r)
        r.register(_Load(state))
        r.register(_Prefix(router))

    def answered(self, path: str, status: int, retry_after: bool, arrived: float, completion: bool) -> None:
        self.requests.labels(path, outcome(status, retry_after)).inc()
        if completion:
            self.duration.labels(path).observe(time.monotonic() - arrived)

    def first_byte(self, timing: Timing) -> None:
        """Decode sent its first byte: the request's time to first token and its KV hop end."""
        now = time.monotonic()
        self.ttft.labels(timing.path).observe(now - timing.arrived)
        self.kv_hop.observe(now - timing.prefilled)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

"""vLLM's serving metrics an HPA may scale a role on, and how each reaches the HPA: the one home of
these facts (the API's enum, the validator, the HPA renderer and docs/scaling.md's adapter rules
read it).

The names are vLLM's own Prometheus metrics (vllm-project/vllm: vllm/v1/metrics/loggers.py @ v0.34.0,
`PrometheusStatLogger.__init__`; every one labelled `model_name` and `engine`, one series per DP
engine of the API server's process). Each role gets the ones that say it is short of instances:

- prefill: requests queued for a prefill engine (`vllm:num_requests_waiting`, a gauge) and the time
  to first token (`vllm:time_to_first_token_seconds`, a histogram: in PD the proxy sends prefill the
  request with one output token, so this is queueing plus prefill).
- decode: KV-cache fill (`vllm:kv_cache_usage_perc`, a gauge, 1 = full: decode holds every running
  request's KV) and the requests in its batches (`vllm:num_requests_running`, a gauge).

An HPA reads none of these from Prometheus itself: it asks the custom metrics API
(`custom.metrics.k8s.io`) for a `Pods` metric of the pods the scale target selects (one per instance,
the leader that serves HTTP and /metrics). An adapter such as prometheus-adapter answers it, with
one rule per metric (`adapter_rules()`): a gauge is reduced over the pod's DP engines (sum of
requests, mean of cache fill), and the TTFT histogram becomes its mean over a window,
rate(_sum) / rate(_count). The HPA asks for `hpa_name`: vLLM's name with `vllm:` -> `vllm_`, the TTFT
mean suffixed `_mean`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import yaml

Role = Literal["prefill", "decode"]

TTFT_WINDOW: Final = "2m"
"""The window the adapter averages TTFT over: at least four scrapes at Prometheus's 30 s default,
so rate() always has two samples."""


@dataclass(frozen=True)
class ServingMetric:
    vllm: str
    """The name in vLLM's /metrics."""
    kind: Literal["gauge", "histogram"]
    role: Role
    hpa_name: str
    """The custom metrics API name the HPA asks for (what the adapter rule publishes)."""
    target: str
    """What a target value means, per instance."""
    upper_bound: float | None
    """A target above this is never reached (the metric cannot exceed it)."""
    per_pod: Literal["sum", "avg"] = "sum"
    """How the adapter reduces the series of one pod's DP engines."""

    def adapter_rule(self) -> dict:
        """The prometheus-adapter rule that publishes the metric under `hpa_name` (its config's
        `rules:` entry). Series need `namespace` and `pod` labels (a PodMonitor or kubernetes_sd
        relabelling adds them)."""
        resources = {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}}
        if self.kind == "histogram":
            total, count = f"{self.vllm}_sum", f"{self.vllm}_count"
            # clamp_min: a pod that served nothing in the window reads 0 s, not NaN.
            query = (f"sum(rate({total}{{<<.LabelMatchers>>}}[{TTFT_WINDOW}])) by (<<.GroupBy>>) / "
                     f"clamp_min(sum(rate({count}{{<<.LabelMatchers>>}}[{TTFT_WINDOW}])) by (<<.GroupBy>>), "
                     "1e-9)")
            return {"seriesQuery": f'{total}{{namespace!="",pod!=""}}', "resources": resources,
                    "name": {"matches": f"^{total}$", "as": self.hpa_name}, "metricsQuery": query}
        return {"seriesQuery": f'{self.vllm}{{namespace!="",pod!=""}}', "resources": resources,
                "name": {"matches": f"^{self.vllm}$", "as": self.hpa_name},
                "metricsQuery": f"{self.per_pod}(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)"}


METRICS: Final = (
    ServingMetric("vllm:num_requests_waiting", "gauge", "prefill", "vllm_num_requests_waiting",
                  "requests waiting for a prefill engine, per instance", None),
    ServingMetric("vllm:time_to_first_token_seconds", "histogram", "prefill",
                  "vllm_time_to_first_token_seconds_mean",
                  f"mean time to first token in seconds over the adapter's {TTFT_WINDOW} window", None),
    ServingMetric("vllm:kv_cache_usage_perc", "gauge", "decode", "vllm_kv_cache_usage_perc",
                  "fraction of the KV cache in use (0 to 1), mean over the instance's DP engines", 1.0,
                  per_pod="avg"),
    ServingMetric("vllm:num_requests_running", "gauge", "decode", "vllm_num_requests_running",
                  "requests in the decode batches, per instance", None),
)
BY_NAME: Final = {m.vllm: m for m in METRICS}

VllmMetric = Literal["vllm:num_requests_waiting", "vllm:time_to_first_token_seconds",
                     "vllm:kv_cache_usage_perc", "vllm:num_requests_running"]
"""The API's enum; tests check it lists exactly METRICS."""


def for_role(role: str) -> list[ServingMetric]:
    return [m for m in METRICS if m.role == role]


def adapter_rules() -> str:
    """prometheus-adapter's `rules:` for every metric, as YAML."""
    return yaml.safe_dump({"rules": [m.adapter_rule() for m in METRICS]}, sort_keys=False, width=1000,
                          default_flow_style=None)

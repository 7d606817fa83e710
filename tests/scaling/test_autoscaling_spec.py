"""spec.<role>.autoscaling without a cluster: the findings the one validator gives (field paths), the
HPA the renderer makes of it, and the metric names against vLLM's own source."""

from __future__ import annotations

import ast
import copy
import re
import subprocess
import typing
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pd_operator.api import serving_metrics
from pd_operator.render import render
from pd_operator.render.autoscaling import quantity
from pd_operator.render.runnable import validate
from support.specs import resolve

pytestmark = pytest.mark.scaling

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "glm-5.3-flash-tp8-dp2tp4.yaml"
VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"

DECODE = {"minReplicas": 1, "maxReplicas": 4,
          "metrics": [{"metric": "vllm:kv_cache_usage_perc", "averageValue": 0.75},
                      {"metric": "vllm:num_requests_running", "averageValue": 48}]}
PREFILL = {"minReplicas": 2, "maxReplicas": 6,
           "metrics": [{"metric": "vllm:num_requests_waiting", "averageValue": 4},
                       {"metric": "vllm:time_to_first_token_seconds", "averageValue": 1.5}],
           "scaleUp": {"stabilizationWindowSeconds": 30, "maxInstances": 2, "periodSeconds": 120},
           "scaleDown": {"stabilizationWindowSeconds": 600}}


def glm(**roles: dict) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    for role, autoscaling in roles.items():
        doc["spec"][role]["autoscaling"] = copy.deepcopy(autoscaling)
    return doc


def autoscaling_findings(doc: dict) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in validate(doc).findings
            if f.code.startswith("Autoscaling") or ".autoscaling" in f.path]


def hpas(doc: dict) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in render(resolve(doc)) if m["kind"] == "HorizontalPodAutoscaler"}


# -- the metric catalog ------------------------------------------------------------------------


def test_the_api_enum_is_the_catalog_and_each_role_gets_the_issues_metrics():
    assert set(typing.get_args(serving_metrics.VllmMetric)) == set(serving_metrics.BY_NAME)
    assert {m.vllm for m in serving_metrics.for_role("prefill")} == {
        "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds"}
    assert {m.vllm for m in serving_metrics.for_role("decode")} == {
        "vllm:kv_cache_usage_perc", "vllm:num_requests_running"}


def test_adapter_rules_publish_every_name_an_hpa_asks_for():
    rules = yaml.safe_load(serving_metrics.adapter_rules())["rules"]
    published = {r["name"]["as"] for r in rules}
    asked = {m["pods"]["metric"]["name"] for hpa in hpas(glm(prefill=PREFILL, decode=DECODE)).values()
             for m in hpa["spec"]["metrics"]}
    assert asked == published and len(rules) == len(serving_metrics.METRICS)
    for rule in rules:
        # Each rule renames the series it discovers and groups by the pod the HPA asks about.
        assert re.fullmatch(rule["name"]["matches"], rule["seriesQuery"].split("{")[0])
        assert "by (<<.GroupBy>>)" in rule["metricsQuery"]
    ttft = next(r for r in rules if r["name"]["as"] == "vllm_time_to_first_token_seconds_mean")
    assert "rate(vllm:time_to_first_token_seconds_sum" in ttft["metricsQuery"]
    assert "rate(vllm:time_to_first_token_seconds_count" in ttft["metricsQuery"]


def _registered(loggers: Path) -> dict[str, str]:
    """name -> gauge/histogram/counter of every metric PrometheusStatLogger constructs."""
    kinds = {"_gauge_cls": "gauge", "_histogram_cls": "histogram", "_counter_cls": "counter"}
    out = {}
    for node in ast.walk(ast.parse(loggers.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in kinds:
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    out[kw.value.value] = kinds[node.func.attr]
    return out


@pytest.mark.vllm
def test_every_metric_is_registered_by_vllm_with_its_kind():
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env` to install vLLM")
    # find_spec locates the package without importing it (vLLM's import is heavy).
    root = subprocess.run([str(VLLM_PYTHON), "-c", "import importlib.util as u; "
                           "print(u.find_spec('vllm').submodule_search_locations[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    registered = _registered(Path(root) / "v1" / "metrics" / "loggers.py")
    assert len(registered) > 20  # the parse found vLLM's metrics at all
    for metric in serving_metrics.METRICS:
        assert registered.get(metric.vllm) == metric.kind, metric.vllm


# -- validation --------------------------------------------------------------------------------


def test_a_valid_spec_has_no_autoscaling_findings():
    assert autoscaling_findings(glm(prefill=PREFILL, decode=DECODE)) == []


@pytest.mark.parametrize(("role", "metric"), [
    ("decode", "vllm:time_to_first_token_seconds"), ("decode", "vllm:num_requests_waiting"),
    ("prefill", "vllm:kv_cache_usage_perc"), ("prefill", "vllm:num_requests_running")])
def test_a_metric_of_the_other_role_is_refused_at_its_path(role, metric):
    spec = {"maxReplicas": 3, "metrics": [{"metric": metric, "averageValue": 0.5}]}
    (finding,) = [f for f in validate(glm(**{role: spec})).errors]
    assert finding.code == "AutoscalingMetricRole"
    assert finding.path == f"spec.{role}.autoscaling.metrics[0].metric"
    fitting = [m.vllm for m in serving_metrics.for_role(role)]
    assert metric in finding.message and all(name in finding.message for name in fitting)


def test_bounds_repeats_and_unreachable_targets():
    spec = {"minReplicas": 5, "maxReplicas": 3,
            "metrics": [{"metric": "vllm:kv_cache_usage_perc", "averageValue": 0.5},
                        {"metric": "vllm:kv_cache_usage_perc", "averageValue": 1.2}]}
    assert autoscaling_findings(glm(decode=spec)) == [
        ("AutoscalingBounds", "spec.decode.autoscaling.minReplicas"),
        ("AutoscalingMetricRepeated", "spec.decode.autoscaling.metrics[1].metric"),
        ("AutoscalingTargetUnreachable", "spec.decode.autoscaling.metrics[1].averageValue")]
    doc = glm(decode=DECODE)
    doc["spec"]["decode"]["replicas"] = 0
    assert autoscaling_findings(doc) == [("AutoscalingBounds", "spec.decode.replicas")]


@pytest.mark.parametrize(("change", "path"), [
    ({"metrics": [{"metric": "vllm:gpu_cache_usage_perc", "averageValue": 0.5}]},
     "spec.decode.autoscaling.metrics[0].metric"),
    ({"metrics": [{"metric": "vllm:kv_cache_usage_perc", "averageValue": 0}]},
     "spec.decode.autoscaling.metrics[0].averageValue"),
    ({"metrics": []}, "spec.decode.autoscaling.metrics"),
    ({"minReplicas": 0}, "spec.decode.autoscaling.minReplicas"),
    ({"scaleDown": {"maxInstances": 0}}, "spec.decode.autoscaling.scaleDown.maxInstances"),
])
def test_schema_refusals_name_the_field(change, path):
    findings = validate(glm(decode={**DECODE, **change})).errors
    assert [(f.code, f.path) for f in findings] == [("InvalidSpec", path)]


def test_names_are_checked_for_the_largest_count_the_hpa_may_reach():
    doc = glm(decode={**DECODE, "maxReplicas": 1})
    doc["metadata"]["name"] = "g" * 42  # <name>-prefill-0 is 52 characters: StatefulSet names fit
    assert not [f for f in validate(doc).errors if f.code == "NameTooLong"]
    doc["spec"]["decode"]["autoscaling"]["maxReplicas"] = 500  # <name>-decode-499 would be 53
    codes = [(f.code, f.path) for f in validate(doc).errors]
    assert ("NameTooLong", "metadata.name") in codes


# -- rendering ---------------------------------------------------------------------------------


def test_one_hpa_per_autoscaled_role_scaling_its_pdrole():
    assert hpas(glm()) == {}
    only_decode = hpas(glm(decode=DECODE))
    assert set(only_decode) == {"glm-flash-decode"}
    both = hpas(glm(prefill=PREFILL, decode=DECODE))
    for role, spec in (("prefill", PREFILL), ("decode", DECODE)):
        hpa = both[f"glm-flash-{role}"]
        kubernetes_validate.validate(hpa, "1.33", strict=True)
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDRole",
                                                 "name": f"glm-flash-{role}"}
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (spec["minReplicas"],
                                                                           spec["maxReplicas"])
        assert hpa["metadata"]["labels"]["pd.serving.dev/role"] == role
        metrics = hpa["spec"]["metrics"]
        assert [(m["type"], m["pods"]["metric"]["name"], m["pods"]["target"]) for m in metrics] == [
            ("Pods", serving_metrics.BY_NAME[t["metric"]].hpa_name,
             {"type": "AverageValue", "averageValue": quantity(t["averageValue"])}) for t in spec["metrics"]]


def test_behavior_follows_the_spec_and_scales_down_gently_by_default():
    both = hpas(glm(prefill=PREFILL, decode=DECODE))
    # Decode gave no behavior: one instance a minute down after a 5-minute window, the HPA's own
    # scale-up.
    assert both["glm-flash-decode"]["spec"]["behavior"] == {"scaleDown": {
        "stabilizationWindowSeconds": 300, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}
    # Prefill gave both; a scaleDown without maxInstances leaves the rate to the HPA.
    assert both["glm-flash-prefill"]["spec"]["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 30,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 120}]},
        "scaleDown": {"stabilizationWindowSeconds": 600}}


@pytest.mark.parametrize(("value", "text"), [
    (0.75, "750m"), (0.001, "1m"), (1.5, "1500m"), (2, "2"), (48, "48"), (1000, "1k"), (48000, "48k"),
    (1_000_000, "1M"), (1000.5, "1000500m"), (0.7, "700m")])
def test_targets_render_as_canonical_quantities(value, text):
    # The API server stores a quantity in this form; another spelling would read back as drift.
    assert quantity(value) == text

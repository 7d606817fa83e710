"""One HorizontalPodAutoscaler per role with `spec.<role>.autoscaling`: it scales the role's PDRole.

Why an HPA on the PDRole and not on a StatefulSet: a role is many StatefulSets (one per instance), and
the PDRole's scale subresource is the role's instance count, which the operator turns into
instances and drains. Its selector picks one pod per instance, the leader that serves vLLM's /metrics,
so a `Pods` metric averages over instances, which is what the targets are in. Each target is a
`Pods` metric of the custom metrics API under the name the adapter publishes
(pd_operator.api.serving_metrics).
"""

from __future__ import annotations

from pd_operator.api import serving_metrics
from pd_operator.api.types import API_VERSION, AutoscalingSpec, ScalingRule
from pd_operator.render.labels import metadata
from pd_operator.spec.validate import Resolved

HPA_API_VERSION = "autoscaling/v2"
SCALE_TARGET_KIND = "PDRole"
_SUFFIXES = ("", "k", "M", "G")


def quantity(value: float) -> str:
    """`value` to the nearest 0.001 as the API server writes the quantity back (its canonical
    decimal form: 0.75 -> 750m, 2 -> 2, 48000 -> 48k), so an applied HPA reads back unchanged."""
    milli = round(value * 1000)
    if milli % 1000:
        return f"{milli}m"
    whole, suffix = milli // 1000, 0
    while whole and whole % 1000 == 0 and suffix + 1 < len(_SUFFIXES):
        whole, suffix = whole // 1000, suffix + 1
    return f"{whole}{_SUFFIXES[suffix]}"


def _rule(rule: ScalingRule) -> dict:
    out: dict = {}
    if rule.stabilization_window_seconds is not None:
        out["stabilizationWindowSeconds"] = rule.stabilization_window_seconds
    if rule.max_instances is not None:
        # `Pods` counts replicas of the scale target: here instances of the role.
        out["policies"] = [{"type": "Pods", "value": rule.max_instances,
                             "periodSeconds": rule.period_seconds}]
    return out


def _behavior(spec: AutoscalingSpec) -> dict:
    out = {"scaleUp": _rule(spec.scale_up), "scaleDown": _rule(spec.scale_down)}
    return {direction: rule for direction, rule in out.items() if rule}


def horizontal_pod_autoscaler(ctx: Resolved, role: str) -> dict:
    spec = ctx.role(role).autoscaling
    assert spec is not None, "only roles with autoscaling get an HPA"
    metrics = [{"type": "Pods", "pods": {
        "metric": {"name": serving_metrics.BY_NAME[target.metric].hpa_name},
        "target": {"type": "AverageValue", "averageValue": quantity(target.average_value)}}}
        for target in spec.metrics]
    out: dict = {
        "apiVersion": HPA_API_VERSION, "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(ctx, ctx.names.role(role), role),
        "spec": {"scaleTargetRef": {"apiVersion": API_VERSION, "kind": SCALE_TARGET_KIND,
                                    "name": ctx.names.role(role)},
                 "minReplicas": spec.min_replicas, "maxReplicas": spec.max_replicas,
                 "metrics": metrics}}
    behavior = _behavior(spec)
    if behavior:
        out["spec"]["behavior"] = behavior
    return out


def autoscalers(ctx: Resolved) -> list[dict]:
    return [horizontal_pod_autoscaler(ctx, role) for role in ("prefill", "decode")
            if ctx.role(role).autoscaling is not None]

"""What the security tests need to know about a rendered PDDeployment: its pods (one per
workload, with the template's labels and named ports) and the ports each serving pod listens on."""

from __future__ import annotations

import copy
from typing import Any

from pd_operator.render import render
from pd_operator.render.runnable import validate
from pd_operator.spec.ports import PROBE_PORT, kv_handshake, side_channel
from pd_operator.spec.validate import Validation
from support.network_policy import Pod

WORKLOADS = ("StatefulSet", "Deployment")
CONTROLLER_LABELS = {"StatefulSet": "controller-revision-hash", "Deployment": "pod-template-hash"}
"""The label each workload controller adds to the pods it creates, beside the template's
(kubernetes/kubernetes: pkg/controller/statefulset/stateful_set_utils.go, pkg/controller/deployment/
sync.go @ v1.36.3)."""


def workload_pods(manifests: list[dict]) -> dict[str, Pod]:
    """Pod of each workload by workload name (all pods of a template share labels and ports), with
    the label its controller adds."""
    out = {}
    for m in manifests:
        if m["kind"] not in WORKLOADS:
            continue
        template = m["spec"]["template"]
        ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"]
                 for p in c.get("ports", []) if "name" in p}
        labels = {**template["metadata"]["labels"], CONTROLLER_LABELS[m["kind"]]: "5d8f7c6b9"}
        out[m["metadata"]["name"]] = Pod(m["metadata"]["name"], m["metadata"]["namespace"], labels, ports)
    return out


def pod_specs(manifests: list[dict]) -> list[tuple[str, dict]]:
    """(workload name, pod spec) of every workload."""
    return [(m["metadata"]["name"], m["spec"]["template"]["spec"]) for m in manifests
            if m["kind"] in WORKLOADS]


def component(pod: Pod) -> str:
    return pod.labels.get("app.kubernetes.io/component", "")


def kv_ports(validation: Validation, role: str) -> dict[str, int]:
    """The first port of each KV-side range a pod of `role` listens on (pod 0 of the instance)."""
    spec, plan = validation.deployment.spec, validation.shapes[role]
    kv_port = spec.kv_transfer.kv_port
    out = {"KV handshake": kv_handshake(kv_port, plan, 0).start,
           "KV side channel": side_channel(kv_port, plan, 0).start,
           "KV-link probe": PROBE_PORT}  # prefill: the descriptor; decode: the gate's /ready
    return out


def stranger(pod: Pod, *, name: str | None = None, namespace: str | None = None,
             labels: dict[str, str] | None = None) -> Pod:
    """A copy of `pod` under another deployment name, namespace or label set."""
    new_labels = copy.deepcopy(pod.labels if labels is None else labels)
    if name is not None:
        new_labels = {k: (name if v == pod.labels.get("pd.serving.dev/deployment") else v)
                      for k, v in new_labels.items()}
    return Pod(f"{pod.name}-stranger", namespace or pod.namespace, new_labels, pod.ports)


def validated_render(doc: dict, **options: Any) -> tuple[Validation, list[dict]]:
    """`doc` validated (with the validator's `options`, e.g. an admin's node_access) and rendered."""
    validation = validate(doc, **options)
    assert validation.ok, [f.line() for f in validation.errors]
    return validation, render(validation.resolved)

"""The rendered NetworkPolicies admit only the deployment's own pods to the KV handshake, side
channel and KV-link probe ports, the engines' HTTP port only from its namespace, and the proxy's
admin port only from the operator's namespace.

Flows are checked with the pure evaluator in support/network_policy.py against every example and
against generated valid specs.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings

from pd_operator.render.policy import OPERATOR_NAMESPACE
from pd_operator.spec.validate import validate
from support.network_policy import Pod, allowed
from support.rendered_pods import component, kv_ports, stranger, validated_render, workload_pods
from support.renders import VALID_EXAMPLES
from support.spec_strategies import deployments
from support.specs import example

ELSEWHERE = "elsewhere"
NAMESPACES = {"default": {"kubernetes.io/metadata.name": "default"},
              ELSEWHERE: {"kubernetes.io/metadata.name": ELSEWHERE},
              OPERATOR_NAMESPACE: {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}}


def _dest_ports(validation, pods: dict[str, Pod]) -> dict[str, tuple[Pod, int]]:
    """Named destinations: (pod, port) for every KV-side port kind and HTTP."""
    spec = validation.deployment.spec
    by_component = {component(p): p for p in pods.values()}
    out = {}
    for role in ("prefill", "decode"):
        for kind, port in kv_ports(validation, role).items():
            out[f"{role} {kind}"] = (by_component[role], port)
        out[f"{role} HTTP"] = (by_component[role], spec.serving_port)
    if "proxy" in by_component:
        out["proxy HTTP"] = (by_component["proxy"], spec.proxy.port)
        out["proxy admin"] = (by_component["proxy"], spec.proxy.admin_port)
    return out


def _sources(pods: dict[str, Pod], namespace: str) -> dict[str, Pod]:
    by_component = {component(p): p for p in pods.values()}
    out = {f"own {c}": p for c, p in by_component.items()}
    decode = by_component["decode"]
    out["pod of another PDDeployment"] = stranger(decode, name="other-deployment")
    out["pod in another namespace with the same labels"] = stranger(decode, namespace=ELSEWHERE)
    out["plain pod of the namespace"] = Pod("client", namespace, {"app": "client"})
    out["the operator's pod"] = Pod("pd-operator", OPERATOR_NAMESPACE,
                                    {"app.kubernetes.io/name": "pd-operator"})
    return out


# (source, destination kind, allowed). Destination kinds without a pod in an example are skipped.
FLOWS = [
    ("own prefill", "decode KV handshake", True),
    ("own decode", "prefill KV handshake", True),
    ("own decode", "prefill KV side channel", True),
    ("own decode", "prefill KV-link probe", True),
    ("own proxy", "prefill HTTP", True),
    ("own proxy", "decode HTTP", True),
    ("plain pod of the namespace", "decode HTTP", True),
    ("pod of another PDDeployment", "prefill KV handshake", False),
    ("pod of another PDDeployment", "decode KV handshake", False),
    ("pod of another PDDeployment", "prefill KV side channel", False),
    ("pod of another PDDeployment", "decode KV side channel", False),
    ("pod of another PDDeployment", "prefill KV-link probe", False),
    ("pod of another PDDeployment", "decode KV-link probe", False),
    ("pod of another PDDeployment", "decode HTTP", True),
    ("pod in another namespace with the same labels", "prefill KV handshake", False),
    ("pod in another namespace with the same labels", "decode KV side channel", False),
    ("pod in another namespace with the same labels", "decode HTTP", False),
    ("plain pod of the namespace", "prefill KV handshake", False),
    ("plain pod of the namespace", "decode KV side channel", False),
    ("plain pod of the namespace", "prefill KV-link probe", False),
    # The proxy's clients' port is open to all; its admin port to the operator's namespace only.
    ("plain pod of the namespace", "proxy HTTP", True),
    ("pod in another namespace with the same labels", "proxy HTTP", True),
    ("the operator's pod", "proxy admin", True),
    ("the operator's pod", "decode HTTP", False),
    ("own decode", "proxy admin", False),
    ("plain pod of the namespace", "proxy admin", False),
    ("pod in another namespace with the same labels", "proxy admin", False),
    ("pod of another PDDeployment", "proxy admin", False),
]


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_flow_table_on_every_example(path):
    validation, manifests = validated_render(example(path))
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    pods = workload_pods(manifests)
    sources = _sources(pods, validation.deployment.namespace)
    dests = _dest_ports(validation, pods)
    checked, wrong = 0, []
    for source, dest, expected in FLOWS:
        if source not in sources or dest not in dests:
            continue  # e.g. no proxy when it is disabled
        pod, port = dests[dest]
        got = allowed(policies, sources[source], pod, port, namespaces=NAMESPACES)
        checked += 1
        if got != expected:
            wrong.append(f"{source} -> {dest} ({port}): {'allowed' if got else 'denied'}")
    assert not wrong, wrong
    assert checked >= 16, f"only {checked} flows applied to {path.stem}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(deployments())
def test_generated_specs_keep_strangers_off_kv_ports(doc):
    validation = validate(doc)
    assume(validation.ok)
    _, manifests = validated_render(doc)
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    pods = workload_pods(manifests)
    for pod in pods.values():
        role = component(pod)
        if role not in ("prefill", "decode") or validation.deployment.role(role).host_network:
            continue  # NetworkPolicy does not apply to host-network pods; see test_pod_security
        own = stranger(pod, labels={"pd.serving.dev/deployment": validation.deployment.name})
        foreign = stranger(pod, name=f"{validation.deployment.name}x")
        for port in kv_ports(validation, role).values():
            assert allowed(policies, own, pod, port), f"own pod -> {pod.name}:{port} denied"
            assert not allowed(policies, foreign, pod, port), f"other deployment -> {pod.name}:{port}"
            client = Pod("client", pod.namespace, {})
            assert not allowed(policies, client, pod, port), f"plain pod -> {pod.name}:{port}"

"""The rendered NetworkPolicy admits only the deployment's own pods to the KV handshake, side
channel, KV-link probe and metadata ports, and the engines' HTTP port only from its namespace.

Flows are checked with the pure evaluator in netpol.py against every example and against
generated valid specs, including a metadata server whose port equals the serving port.
"""

from __future__ import annotations

import pytest
from deployment_view import component, kv_ports, stranger, validated_render, workload_pods
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from netpol import Pod, allowed
from render_cases import VALID_EXAMPLES, load
from test_render_generated import deployments

from pd_operator.validate import validate

ELSEWHERE = "elsewhere"
NAMESPACES = {"default": {"kubernetes.io/metadata.name": "default"},
              ELSEWHERE: {"kubernetes.io/metadata.name": ELSEWHERE}}


def _dest_ports(validation, pods: dict[str, Pod]) -> dict[str, tuple[Pod, int]]:
    """Named destinations: (pod, port) for every KV-side port kind, metadata and HTTP."""
    spec = validation.deployment.spec
    by_component = {component(p): p for p in pods.values()}
    out = {}
    for role in ("prefill", "decode"):
        for kind, port in kv_ports(validation, role).items():
            out[f"{role} {kind}"] = (by_component[role], port)
        out[f"{role} HTTP"] = (by_component[role], spec.serving_port)
    if "metadata" in by_component:
        out["metadata server"] = (by_component["metadata"], spec.kv_transfer.metadata.server_port)
    return out


def _sources(pods: dict[str, Pod], namespace: str) -> dict[str, Pod]:
    by_component = {component(p): p for p in pods.values()}
    out = {f"own {c}": p for c, p in by_component.items()}
    decode = by_component["decode"]
    out["pod of another PDDeployment"] = stranger(decode, name="other-deployment")
    out["pod in another namespace with the same labels"] = stranger(decode, namespace=ELSEWHERE)
    out["plain pod of the namespace"] = Pod("client", namespace, {"app": "client"})
    return out


# (source, destination kind, allowed). Destination kinds without a pod in an example are skipped.
FLOWS = [
    ("own prefill", "decode KV handshake", True),
    ("own decode", "prefill KV handshake", True),
    ("own decode", "prefill KV side channel", True),
    ("own decode", "prefill KV-link probe", True),
    ("own prefill", "metadata server", True),
    ("own decode", "metadata server", True),
    ("own proxy", "prefill HTTP", True),
    ("own proxy", "decode HTTP", True),
    ("plain pod of the namespace", "decode HTTP", True),
    ("pod of another PDDeployment", "prefill KV handshake", False),
    ("pod of another PDDeployment", "decode KV handshake", False),
    ("pod of another PDDeployment", "prefill KV side channel", False),
    ("pod of another PDDeployment", "decode KV side channel", False),
    ("pod of another PDDeployment", "prefill KV-link probe", False),
    ("pod of another PDDeployment", "metadata server", False),
    ("pod of another PDDeployment", "decode HTTP", True),
    ("pod in another namespace with the same labels", "prefill KV handshake", False),
    ("pod in another namespace with the same labels", "decode KV side channel", False),
    ("pod in another namespace with the same labels", "metadata server", False),
    ("pod in another namespace with the same labels", "decode HTTP", False),
    ("plain pod of the namespace", "prefill KV handshake", False),
    ("plain pod of the namespace", "decode KV side channel", False),
    ("plain pod of the namespace", "metadata server", False),
]


@pytest.mark.parametrize("example", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_flow_table_on_every_example(example):
    validation, manifests = validated_render(load(example))
    (policy,) = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    pods = workload_pods(manifests)
    sources = _sources(pods, validation.deployment.namespace)
    dests = _dest_ports(validation, pods)
    checked, wrong = 0, []
    for source, dest, expected in FLOWS:
        if source not in sources or dest not in dests:
            continue  # e.g. no metadata server in P2P mode, no proxy when it is disabled
        pod, port = dests[dest]
        got = allowed([policy], sources[source], pod, port, namespaces=NAMESPACES)
        checked += 1
        if got != expected:
            wrong.append(f"{source} -> {dest} ({port}): {'allowed' if got else 'denied'}")
    assert not wrong, wrong
    assert checked >= 16, f"only {checked} flows applied to {example.stem}"


def test_the_table_covers_the_metadata_server_and_the_probe():
    # The examples must include an http metadata server and a preset prefill (probe sidecar),
    # or the rows about them above would never run.
    kinds = set()
    for example in VALID_EXAMPLES:
        validation, manifests = validated_render(load(example))
        kinds |= set(_dest_ports(validation, workload_pods(manifests)))
    assert {"metadata server", "prefill KV-link probe"} <= kinds


@st.composite
def with_metadata_port(draw) -> dict:
    """A generated valid spec whose http metadata server may share the engines' serving port."""
    doc = draw(deployments())
    if draw(st.booleans()):
        port = draw(st.sampled_from([8000, 9090, 31000]))
        doc["spec"]["kvTransfer"]["metadata"] = {"mode": "http", "serverPort": port}
    return doc


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(with_metadata_port())
def test_generated_specs_keep_strangers_off_kv_and_metadata_ports(doc):
    validation = validate(doc)
    assume(validation.ok)
    _, manifests = validated_render(doc)
    (policy,) = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    pods = workload_pods(manifests)
    spec = validation.deployment.spec
    for pod in pods.values():
        role = component(pod)
        if role in ("prefill", "decode") and validation.deployment.role(role).host_network:
            continue  # NetworkPolicy does not apply to host-network pods; see test_pod_security
        ports = (list(kv_ports(validation, role).values()) if role in ("prefill", "decode")
                 else [spec.kv_transfer.metadata.server_port] if role == "metadata" else [])
        own = stranger(pod, labels={"pd.serving.dev/deployment": validation.deployment.name})
        foreign = stranger(pod, name=f"{validation.deployment.name}x")
        for port in ports:
            assert allowed([policy], own, pod, port), f"own pod -> {pod.name}:{port} denied"
            assert not allowed([policy], foreign, pod, port), f"other deployment -> {pod.name}:{port}"
            client = Pod("client", pod.namespace, {})
            assert not allowed([policy], client, pod, port), f"plain pod -> {pod.name}:{port}"


def test_a_metadata_server_on_the_serving_port_is_refused():
    # The policy opens the serving port of every pod it selects to the namespace, the metadata
    # server's included, so the validator must keep the two ports apart.
    doc = load(next(p for p in VALID_EXAMPLES if p.stem == "qwen3-next-http-metadata"))
    doc["spec"]["kvTransfer"]["metadata"]["serverPort"] = doc["spec"].get("servingPort", 8000)
    found = [f for f in validate(doc).errors if f.code == "MetadataPortExposed"]
    assert [f.path for f in found] == ["spec.kvTransfer.metadata.serverPort"]

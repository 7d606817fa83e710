"""The rendered NetworkPolicies as a neighbouring pod would try them (issue 34): an engine's serving
port takes requests only from its own proxy (and the metrics scrapers), its KV ports only from the
deployment's engines, its KV-link probe port also from the operator's namespace; a proxy takes
clients from its namespace and spec.proxy.allowFrom only, its admin port from the operator's
namespace only. Pods of the deployment are the ones their workload controllers made: a pod a user
creates by hand with the deployment's label alone reaches nothing.

Flows are checked with the pure evaluator in support/network_policy.py against every example and
against generated valid specs; the test cluster runs no CNI that enforces NetworkPolicy, so no
flow here is tried as a real connection (docs/tests.md).
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, assume, given, settings

from pd_operator.api.types import ClientPeer
from pd_operator.proxy.options import ADMIN_TOKEN_ENV
from pd_operator.render import Boundary, render
from pd_operator.render.policy import OPERATOR_NAMESPACE
from pd_operator.render.runnable import validate
from support.helm_chart import NAMESPACE, operator_container
from support.helm_chart import rendered as chart
from support.network_policy import Pod, allowed
from support.rendered_pods import component, kv_ports, stranger, validated_render, workload_pods
from support.renders import VALID_EXAMPLES
from support.spec_strategies import deployments
from support.specs import example

ELSEWHERE, GATEWAY, MONITORING = "elsewhere", "gateway", "monitoring"
NAMESPACES = {ns: {"kubernetes.io/metadata.name": ns}
              for ns in ("default", ELSEWHERE, GATEWAY, MONITORING, OPERATOR_NAMESPACE)}
DEPLOYMENT = "pd.serving.dev/deployment"
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
"""The chart's default metrics.scrapers."""
BOUNDARY = Boundary(OPERATOR_NAMESPACE, (ClientPeer.model_validate(PROMETHEUS),))


def rendered(doc: dict, boundary: Boundary = BOUNDARY):
    validation, _ = validated_render(doc)
    return validation, render(validation.resolved, boundary=boundary)


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
        out["proxy metrics"] = (by_component["proxy"], spec.proxy.metrics_port)
    return out


def _sources(pods: dict[str, Pod], namespace: str) -> dict[str, Pod]:
    by_component = {component(p): p for p in pods.values()}
    out = {f"own {c}": p for c, p in by_component.items()}
    decode = by_component["decode"]
    name = decode.labels[DEPLOYMENT]
    out["pod of another PDDeployment"] = stranger(decode, name="other-deployment")
    out["pod in another namespace with the same labels"] = stranger(decode, namespace=ELSEWHERE)
    out["plain pod of the namespace"] = Pod("client", namespace, {"app": "client"})
    out["hand-made pod labelled with the deployment"] = Pod("forged", namespace, {DEPLOYMENT: name})
    out["hand-made pod with an engine's template labels"] = stranger(
        decode, labels={k: v for k, v in decode.labels.items() if k != "controller-revision-hash"})
    if "proxy" in by_component:
        proxy = by_component["proxy"]
        out["hand-made pod with the proxy's template labels"] = stranger(
            proxy, labels={k: v for k, v in proxy.labels.items() if k != "pod-template-hash"})
    out["the operator's pod"] = Pod("pd-operator", OPERATOR_NAMESPACE,
                                    {"app.kubernetes.io/name": "pd-operator"})
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    out["Prometheus in monitoring"] = Pod("prometheus-0", MONITORING, prometheus)
    out["Prometheus-labelled pod of the namespace"] = Pod("fake-prometheus", namespace, prometheus)
    out["gateway pod"] = Pod("gateway", GATEWAY, {"app": "gateway"})
    return out


ENGINE_PORTS = ("prefill KV handshake", "decode KV handshake", "prefill KV side channel",
                "decode KV side channel", "prefill KV-link probe", "decode KV-link probe",
                "prefill HTTP", "decode HTTP")
ENGINE_HTTP = ("prefill HTTP", "decode HTTP")
OUTSIDERS = ("pod of another PDDeployment", "pod in another namespace with the same labels",
             "plain pod of the namespace", "hand-made pod labelled with the deployment",
             "hand-made pod with an engine's template labels",
             "hand-made pod with the proxy's template labels",
             "Prometheus-labelled pod of the namespace", "gateway pod")

# (source, destination kind, allowed). Destinations or sources without a pod in an example are skipped.
FLOWS = [
    ("own prefill", "decode KV handshake", True),
    ("own decode", "prefill KV handshake", True),
    ("own decode", "prefill KV side channel", True),
    ("own decode", "prefill KV-link probe", True),
    ("own proxy", "prefill HTTP", True),
    ("own proxy", "decode HTTP", True),
    # Attack: a neighbour posts /invocations (no key needed) with its own kv_transfer_params to an
    # engine, or reaches Mooncake's ports, from any pod of the namespace or one labelled like ours.
    *[(source, dest, False) for source in OUTSIDERS for dest in ENGINE_PORTS],
    ("own proxy", "decode KV handshake", False),
    # The operator reads nothing but the KV-link probe port; the scrapers only the serving port.
    ("the operator's pod", "decode KV-link probe", True),
    ("the operator's pod", "prefill KV-link probe", True),
    ("the operator's pod", "decode HTTP", False),
    ("the operator's pod", "decode KV handshake", False),
    ("Prometheus in monitoring", "decode HTTP", True),
    ("Prometheus in monitoring", "prefill HTTP", True),
    ("Prometheus in monitoring", "decode KV handshake", False),
    ("Prometheus in monitoring", "proxy admin", False),
    ("Prometheus in monitoring", "proxy metrics", True),
    ("plain pod of the namespace", "proxy metrics", False),
    ("Prometheus-labelled pod of the namespace", "proxy metrics", False),
    ("the operator's pod", "proxy metrics", False),
    # Attack: the proxy is open to every pod of the cluster. Its namespace only, by default.
    ("plain pod of the namespace", "proxy HTTP", True),
    ("pod in another namespace with the same labels", "proxy HTTP", False),
    ("gateway pod", "proxy HTTP", False),
    ("the operator's pod", "proxy admin", True),
    ("own decode", "proxy admin", False),
    ("plain pod of the namespace", "proxy admin", False),
    ("pod in another namespace with the same labels", "proxy admin", False),
    ("pod of another PDDeployment", "proxy admin", False),
]


def _check(policies: list[dict], pods: dict[str, Pod], namespace: str, validation,
           flows: list[tuple[str, str, bool]]) -> int:
    sources, dests = _sources(pods, namespace), _dest_ports(validation, pods)
    checked, wrong = 0, []
    for source, dest, expected in flows:
        if source not in sources or dest not in dests:
            continue  # e.g. no proxy when it is disabled
        pod, port = dests[dest]
        got = allowed(policies, sources[source], pod, port, namespaces=NAMESPACES)
        checked += 1
        if got != expected:
            wrong.append(f"{source} -> {dest} ({port}): {'allowed' if got else 'denied'}")
    assert not wrong, wrong
    return checked


def _policies(manifests: list[dict]) -> list[dict]:
    return [m for m in manifests if m["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_flow_table_on_every_example(path):
    validation, manifests = rendered(example(path))
    checked = _check(_policies(manifests), workload_pods(manifests), validation.deployment.namespace,
                     validation, FLOWS)
    assert checked >= 80, f"only {checked} flows applied to {path.stem}"


def _with_proxy(doc: dict, **proxy: object) -> dict:
    out = copy.deepcopy(doc)
    out["spec"].setdefault("proxy", {}).update(proxy)
    return out


GATEWAY_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": GATEWAY}},
                "podSelector": {"matchLabels": {"app": "gateway"}}}


def test_allow_from_opens_the_proxy_to_the_peers_it_names_and_no_one_else():
    validation, manifests = rendered(_with_proxy(example(), allowFrom=[GATEWAY_PEER]))
    checked = _check(_policies(manifests), workload_pods(manifests), validation.deployment.namespace,
                     validation, [("gateway pod", "proxy HTTP", True), ("gateway pod", "proxy admin", False),
                                  ("gateway pod", "decode HTTP", False),
                                  ("pod in another namespace with the same labels", "proxy HTTP", False),
                                  ("plain pod of the namespace", "proxy HTTP", True)])
    assert checked == 5


def test_without_the_proxy_the_serving_port_admits_the_namespace_and_allow_from_only():
    validation, manifests = rendered(_with_proxy(example(), enabled=False, allowFrom=[GATEWAY_PEER]))
    pods = workload_pods(manifests)
    assert not any(component(p) == "proxy" for p in pods.values())
    flows = [(source, dest, True) for source in ("plain pod of the namespace", "gateway pod")
             for dest in ENGINE_HTTP]
    flows += [(source, dest, False) for source in ("pod in another namespace with the same labels",)
              for dest in ENGINE_HTTP]
    flows += [("plain pod of the namespace", "decode KV handshake", False),
              ("gateway pod", "prefill KV side channel", False)]
    namespace = validation.deployment.namespace
    assert _check(_policies(manifests), pods, namespace, validation, flows) == len(flows)


def test_no_scraper_is_admitted_unless_the_operator_names_one():
    validation, none = rendered(example(), Boundary())
    assert _check(_policies(none), workload_pods(none), "default", validation,
                  [("Prometheus in monitoring", dest, False) for dest in ENGINE_PORTS]) == len(ENGINE_PORTS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(deployments())
def test_generated_specs_keep_strangers_off_engine_ports(doc):
    validation = validate(doc)
    assume(validation.ok)
    _, manifests = rendered(doc)
    policies = _policies(manifests)
    pods = workload_pods(manifests)
    engines = [p for p in pods.values() if component(p) in ("prefill", "decode")]
    for pod in engines:
        role = component(pod)
        if validation.deployment.role(role).host_network:
            continue  # NetworkPolicy does not apply to host-network pods; see test_pod_security
        forged = Pod("forged", pod.namespace, {DEPLOYMENT: validation.deployment.name})
        foreign = stranger(pod, name=f"{validation.deployment.name}x")
        client = Pod("client", pod.namespace, {})
        # Without the proxy the serving port is the clients' (the namespace's and allowFrom's).
        closed = [*kv_ports(validation, role).values()]
        if validation.deployment.spec.proxy.enabled:
            closed.append(validation.deployment.spec.serving_port)
        for port in closed:
            assert any(allowed(policies, own, pod, port) for own in engines), f"own pods -> {pod.name}:{port}"
            strangers = (("other deployment", foreign), ("hand-made pod", forged), ("plain pod", client))
            for who, source in strangers:
                assert not allowed(policies, source, pod, port), f"{who} -> {pod.name}:{port}"


def test_the_operators_metrics_admit_only_the_scrapers():
    """Attack: a tenant's pod reads the operator's metrics, which name every watched PDDeployment."""
    docs = chart("default")
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    labels = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in operator_container(docs)["ports"]}
    operator = Pod("pd-operator", NAMESPACE, labels, ports)
    prometheus = Pod("prometheus-0", MONITORING, {"app.kubernetes.io/name": "prometheus"})
    tenant = Pod("client", "default", {"app.kubernetes.io/name": "prometheus"})
    namespaces = {**NAMESPACES, NAMESPACE: {"kubernetes.io/metadata.name": NAMESPACE}}
    assert policies and allowed(policies, prometheus, operator, ports["metrics"], namespaces=namespaces)
    assert not allowed(policies, tenant, operator, ports["metrics"], namespaces=namespaces)
    assert allowed(policies, tenant, operator, ports["health"], namespaces=namespaces)
    args = operator_container(docs)["args"]
    scrapers = [ClientPeer.model_validate_json(a.split("=", 1)[1]) for a in args
                if a.startswith("--metrics-scraper=")]
    assert [s.to_wire() for s in scrapers] == [PROMETHEUS]  # the engines' policies admit the same


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_a_proxy_without_an_api_key_is_warned_and_no_example_serves_without_one(path):
    """Attack: any admitted pod uses the proxy without a key, and nothing says so."""
    doc = example(path)
    assert doc["spec"]["proxy"]["apiKey"]["name"]
    assert not [f for f in validate(doc).findings if f.code == "ProxyWithoutApiKey"]
    keyless = copy.deepcopy(doc)
    del keyless["spec"]["proxy"]["apiKey"]
    (warning,) = [f for f in validate(keyless).findings if f.code == "ProxyWithoutApiKey"]
    assert warning.severity == "warning" and warning.path == "spec.proxy.apiKey"
    assert validate(keyless).ok  # a warning: it still serves
    disabled = validate(_with_proxy(keyless, enabled=False))
    assert not [f for f in disabled.findings if f.code == "ProxyWithoutApiKey"]


def test_each_deployments_proxy_gets_its_own_admin_token_and_its_probe_sends_it():
    """Attack: without NetworkPolicy enforcement any pod reads /pd/state or resets every engine's
    prefix cache; with the operator's key each proxy wants a token no other deployment's shares."""
    def proxy_container(doc: dict, boundary: Boundary) -> dict:
        _, manifests = rendered(doc, boundary)
        deployment = next(m for m in manifests if m["kind"] == "Deployment")
        return deployment["spec"]["template"]["spec"]["containers"][0]

    keyed = Boundary(OPERATOR_NAMESPACE, (), "operator-key")
    mine = proxy_container(example(), keyed)
    token = next(e["value"] for e in mine["env"] if e["name"] == ADMIN_TOKEN_ENV)
    assert mine["livenessProbe"]["httpGet"]["httpHeaders"] == [{"name": "Authorization",
                                                               "value": f"Bearer {token}"}]
    other = copy.deepcopy(example())
    other["metadata"]["name"] = "other"
    theirs = proxy_container(other, keyed)
    assert token not in str(theirs["env"]) and len(token) == 64
    assert ADMIN_TOKEN_ENV not in str(proxy_container(example(), Boundary()))

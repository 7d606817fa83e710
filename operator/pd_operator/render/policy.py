"""The NetworkPolicies and the PodDisruptionBudgets of one PDDeployment.

The boundary (docs/architecture.md, "Network boundary"): an engine's serving port takes requests only
from its own proxy pods (vLLM's --api-key guards only /v1, /v2, /inference and /cohere, and
/invocations dispatches to completions with the body's kv_transfer_params: vllm-project/vllm:
vllm/entrypoints/serve/middleware/authenticate.py, vllm/entrypoints/serve/sagemaker/api_router.py
@ v0.34.0), its KV ports only from the deployment's engines, its KV-link probe port also from the
operator's namespace, and the metrics scrapers the chart names reach the serving port (vLLM's
/metrics). Peers inside the deployment are selected by every label the operator sets on them plus
the label their workload controller sets (pod-template-hash, controller-revision-hash): NetworkPolicy
cannot select by owner, so a pod that a user of the namespace creates by hand with all of these
labels is inside the boundary; who may create pods in the namespace is.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from pd_operator.api.labels import (
    COMPONENT,
    CONTROLLER_REVISION_HASH,
    DEPLOYMENT,
    MANAGED_BY,
    MANAGER,
    NAMESPACE_NAME,
    POD_TEMPLATE_HASH,
)
from pd_operator.api.types import ClientPeer
from pd_operator.render.labels import metadata, selector
from pd_operator.render.proxy import COMPONENT as PROXY
from pd_operator.spec.ports import PROBE_PORT
from pd_operator.spec.validate import Resolved

ISOLATED = ("prefill", "decode")
OPERATOR_NAMESPACE = "pd-system"
"""Where the chart is installed unless told otherwise (README, Quick start); the controller renders
with the namespace it runs in."""


@dataclass(frozen=True)
class Boundary:
    """Who outside a PDDeployment its NetworkPolicies admit, as the operator was started (the chart's
    values): the operator's namespace (proxy admin ports, engines' KV-link probe port) and the
    metrics scrapers (engines' serving port, proxies' metrics port; the chart's metrics.scrapers,
    none unless told)."""

    operator_namespace: str = OPERATOR_NAMESPACE
    scrapers: tuple[ClientPeer, ...] = ()
    admin_key: str | None = None
    """The operator's secret (the chart's Secret `<release>-proxy-admin`) each proxy's admin token is
    derived from (admin_token); None: the admin ports want no token."""


def admin_token(boundary: Boundary, ctx: Resolved) -> str | None:
    """The token one PDDeployment's proxies want on their admin port: an HMAC of its namespace and
    name under the operator's key, so the operator needs to store none, and it reads as well in
    the proxy's pod template as anywhere (whoever may read that may already see what the admin
    port tells). None without a key."""
    if not boundary.admin_key:
        return None
    subject = f"{ctx.deployment.namespace}/{ctx.deployment.name}".encode()
    return hmac.new(boundary.admin_key.encode(), subject, hashlib.sha256).hexdigest()


CHART_DEFAULT = Boundary()
"""Without the operator's flags: the chart's default namespace, no scraper."""


def _tcp(port: int) -> dict:
    return {"protocol": "TCP", "port": port}


def _peers(peers: tuple[ClientPeer, ...] | list[ClientPeer]) -> list[dict]:
    return [p.to_wire() for p in peers]


def engines_of(ctx: Resolved) -> dict:
    """The peer of this deployment's engine pods, as made by their StatefulSets."""
    made = [{"key": COMPONENT, "operator": "In", "values": list(ISOLATED)},
            {"key": CONTROLLER_REVISION_HASH, "operator": "Exists"}]
    return {"podSelector": {"matchLabels": {DEPLOYMENT: ctx.deployment.name, MANAGED_BY: MANAGER},
                            "matchExpressions": made}}


def proxies_of(ctx: Resolved) -> dict:
    """The peer of this deployment's proxy pods, as made by its Deployment."""
    labels = {**selector(ctx, PROXY), COMPONENT: PROXY, MANAGED_BY: MANAGER}
    return {"podSelector": {"matchLabels": labels,
                            "matchExpressions": [{"key": POD_TEMPLATE_HASH, "operator": "Exists"}]}}


def clients_of(ctx: Resolved) -> list[dict]:
    """Who may send requests: the pods of the deployment's namespace and spec.proxy.allowFrom."""
    return [{"podSelector": {}}, *_peers(ctx.deployment.spec.proxy.allow_from)]


def operator_of(boundary: Boundary) -> dict:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: boundary.operator_namespace}}}


def network_policy(ctx: Resolved, boundary: Boundary) -> dict:
    """Serving pods accept any port from the deployment's engines (besides the KV handshake, side
    channel and probe ports, transfers use Mooncake's random RPC ports and the AscendDirect range,
    and multi-pod DP uses HCCL and gloo ports), the serving port from its proxy pods (with the proxy
    disabled: from the clients, clients_of) and from the metrics scrapers, the KV-link probe port
    from the operator's namespace, and prefill's KV-events ports (precise prefix routing) from its
    proxy pods alone: the events carry every prompt's token ids. Nothing else reaches them."""
    spec = ctx.deployment.spec
    http = _tcp(spec.serving_port)
    callers = [proxies_of(ctx)] if spec.proxy.enabled else clients_of(ctx)
    ingress = [{"from": [engines_of(ctx)]}, {"from": callers, "ports": [http]},
               {"from": [operator_of(boundary)], "ports": [_tcp(PROBE_PORT)]}]
    if (events := ctx.kv_events_port("prefill")) is not None:
        last = events + ctx.role("prefill").data_parallel_size - 1
        ingress.append({"from": [proxies_of(ctx)],
                        "ports": [{**_tcp(events), **({"endPort": last} if last > events else {})}]})
    if boundary.scrapers:
        ingress.append({"from": _peers(boundary.scrapers), "ports": [http]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(ctx, ctx.names.network_policy, None),
            "spec": {"podSelector": {"matchLabels": {DEPLOYMENT: ctx.deployment.name},
                                     "matchExpressions": [{"key": COMPONENT, "operator": "In",
                                                           "values": list(ISOLATED)}]},
                     "policyTypes": ["Ingress"], "ingress": ingress}}


def proxy_network_policy(ctx: Resolved, boundary: Boundary) -> dict:
    """Proxy pods accept the clients' port from the clients (clients_of: the namespace and
    spec.proxy.allowFrom), the admin port (/pd/state, /reset_prefix_cache) only from pods of the
    operator's namespace (the operator reads /pd/state there to drain, and nobody else should see
    what the proxy carries or reset every engine's prefix cache), and the metrics port from the
    metrics scrapers."""
    proxy = ctx.deployment.spec.proxy
    ingress = [{"from": clients_of(ctx), "ports": [_tcp(proxy.port)]},
               {"from": [operator_of(boundary)], "ports": [_tcp(proxy.admin_port)]}]
    if boundary.scrapers:
        ingress.append({"from": _peers(boundary.scrapers), "ports": [_tcp(proxy.metrics_port)]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(ctx, ctx.names.proxy, PROXY),
            "spec": {"podSelector": {"matchLabels": selector(ctx, PROXY)},
                     "policyTypes": ["Ingress"], "ingress": ingress}}


def disruption_budget(ctx: Resolved, role: str) -> dict:
    """At most one serving pod of a role down through voluntary disruptions at a time.

    maxUnavailable 1 rather than 0: 0 would block every node drain until someone deletes the
    budget, while 1 lets drains proceed one engine at a time (a multi-pod engine stops when any
    of its pods goes, so more than one would take several engines down at once).
    """
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": metadata(ctx, ctx.names.disruption_budget(role), role),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(ctx, role)}}}

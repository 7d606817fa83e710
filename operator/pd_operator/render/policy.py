"""The NetworkPolicies and the PodDisruptionBudgets of one PDDeployment."""

from __future__ import annotations

from pd_operator.api.labels import COMPONENT, DEPLOYMENT
from pd_operator.render.labels import metadata, selector
from pd_operator.render.proxy import COMPONENT as PROXY
from pd_operator.spec.validate import Resolved

ISOLATED = ("prefill", "decode")
OPERATOR_NAMESPACE = "pd-system"
"""Where the chart is installed unless told otherwise (README, Quick start); the controller renders
with the namespace it runs in."""
NAMESPACE_NAME = "kubernetes.io/metadata.name"
"""The label the API server sets on every namespace: its name."""


def network_policy(ctx: Resolved) -> dict:
    """Serving pods accept any port from this PDDeployment's own pods, and only the
    HTTP serving port from other pods of the namespace.

    Pod-to-pod traffic inside the deployment is not narrowed to the KV ports: besides the KV
    handshake, side channel and probe ports, transfers use Mooncake's random RPC ports
    and the AscendDirect range, and multi-pod DP uses HCCL and gloo ports. Everything else,
    including all KV ports, is closed to other pods. The HTTP serving port stays open to the
    namespace (not just the proxy) so in-namespace clients and metric scrapers can reach engines.
    The proxy has its own (proxy_network_policy).
    """
    own = {"podSelector": {"matchLabels": {DEPLOYMENT: ctx.deployment.name}}}
    http = {"protocol": "TCP", "port": ctx.deployment.spec.serving_port}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(ctx, ctx.names.network_policy, None),
            "spec": {"podSelector": {"matchLabels": {DEPLOYMENT: ctx.deployment.name},
                                     "matchExpressions": [{"key": COMPONENT, "operator": "In",
                                                           "values": list(ISOLATED)}]},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [own]},
                                 {"from": [{"podSelector": {}}], "ports": [http]}]}}


def proxy_network_policy(ctx: Resolved, operator_namespace: str) -> dict:
    """Proxy pods accept the clients' port from anywhere (how it is exposed is the cluster owner's
    choice) and the admin port (/pd/state, /reset_prefix_cache) only from pods of the operator's
    namespace: the operator reads /pd/state there to drain, and nobody else should see what the
    proxy carries or reset every engine's prefix cache. pd-proxy has no metrics endpoint, so there
    is no scraper to admit."""
    proxy = ctx.deployment.spec.proxy
    operator = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: operator_namespace}}}
    admin = {"protocol": "TCP", "port": proxy.admin_port}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(ctx, ctx.names.proxy, PROXY),
            "spec": {"podSelector": {"matchLabels": selector(ctx, PROXY)},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"ports": [{"protocol": "TCP", "port": proxy.port}]},
                                 {"from": [operator], "ports": [admin]}]}}


def disruption_budget(ctx: Resolved, role: str) -> dict:
    """At most one serving pod of a role down through voluntary disruptions at a time.

    maxUnavailable 1 rather than 0: 0 would block every node drain until someone deletes the
    budget, while 1 lets drains proceed one engine at a time (a multi-pod engine stops when any
    of its pods goes, so more than one would take several engines down at once).
    """
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": metadata(ctx, ctx.names.disruption_budget(role), role),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(ctx, role)}}}

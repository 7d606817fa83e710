"""The NetworkPolicy and the PodDisruptionBudgets of one PDDeployment."""

from __future__ import annotations

from pd_operator.api.labels import COMPONENT, DEPLOYMENT
from pd_operator.render.labels import metadata, selector
from pd_operator.spec.validate import Resolved

ISOLATED = ("prefill", "decode")


def network_policy(ctx: Resolved) -> dict:
    """Serving pods accept any port from this PDDeployment's own pods, and only the
    HTTP serving port from other pods of the namespace.

    Pod-to-pod traffic inside the deployment is not narrowed to the KV ports: besides the KV
    handshake, side channel and probe ports, transfers use Mooncake's random RPC ports
    and the AscendDirect range, and multi-pod DP uses HCCL and gloo ports. Everything else,
    including all KV ports, is closed to other pods. The HTTP serving port stays open to the
    namespace (not just the proxy) so in-namespace clients and metric scrapers can reach engines.
    The proxy is not selected: how it is exposed is the cluster owner's choice.
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


def disruption_budget(ctx: Resolved, role: str) -> dict:
    """At most one serving pod of a role down through voluntary disruptions at a time.

    maxUnavailable 1 rather than 0: 0 would block every node drain until someone deletes the
    budget, while 1 lets drains proceed one engine at a time (a multi-pod engine stops when any
    of its pods goes, so more than one would take several engines down at once).
    """
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": metadata(ctx, ctx.names.disruption_budget(role), role),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(ctx, role)}}}

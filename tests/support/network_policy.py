"""A small, pure evaluator of Kubernetes NetworkPolicy ingress semantics (networking.k8s.io/v1).

What it implements, from the API reference (NetworkPolicySpec, NetworkPolicyPeer,
NetworkPolicyPort): a pod is isolated for ingress when some policy of its namespace selects it and
lists Ingress in policyTypes (an absent policyTypes means Ingress); an isolated pod accepts a
connection only when some ingress rule of a selecting policy admits it. A rule admits a flow when
its `from` is empty/absent or some peer matches, and its `ports` is empty/absent or some entry
matches. A peer with only podSelector means pods of the policy's namespace, with only
namespaceSelector all pods of the matching namespaces, with both the matching pods of the matching
namespaces, an ipBlock the sources whose address lies in its cidr and in none of its excepts (a pod
without an address matches no ipBlock). Ports compare protocol (default TCP), number or
container-port name, and endPort. Egress is not needed by the renderer.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)
    """Named container ports (name -> number), for policies that name ports."""
    ip: str | None = None
    """The source's address, for ipBlock peers (None: matches none)."""


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector: matchLabels and matchExpressions ANDed; {} selects everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise ValueError(f"unknown selector operator {op!r}")
        if not ok:
            return False
    return True


def _peer_admits(peer: dict, policy_ns: str, source: Pod, namespaces: dict[str, dict[str, str]]) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        if source.ip is None:
            return False
        address = ipaddress.ip_address(source.ip)
        return (address in ipaddress.ip_network(block["cidr"])
                and not any(address in ipaddress.ip_network(c) for c in block.get("except") or []))
    pod_sel, ns_sel = peer.get("podSelector"), peer.get("namespaceSelector")
    if pod_sel is None and ns_sel is None:
        raise ValueError("a NetworkPolicyPeer needs podSelector, namespaceSelector or ipBlock")
    if ns_sel is None:
        in_namespace = source.namespace == policy_ns
    else:
        in_namespace = selects(ns_sel, namespaces.get(source.namespace, {}))
    return in_namespace and (pod_sel is None or selects(pod_sel, source.labels))


def _port_admits(entry: dict, dest: Pod, port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    want = entry.get("port")
    if want is None:
        return True  # every port of the protocol
    if isinstance(want, str):
        return dest.ports.get(want) == port
    return want <= port <= entry.get("endPort", want)


def _rule_admits(rule: dict, policy_ns: str, source: Pod, dest: Pod, port: int, protocol: str,
                 namespaces: dict[str, dict[str, str]]) -> bool:
    peers, ports = rule.get("from") or [], rule.get("ports") or []
    peer_ok = not peers or any(_peer_admits(p, policy_ns, source, namespaces) for p in peers)
    port_ok = not ports or any(_port_admits(e, dest, port, protocol) for e in ports)
    return peer_ok and port_ok


def isolating(policies: list[dict], dest: Pod) -> list[dict]:
    """The policies that select `dest` for ingress."""
    return [p for p in policies
            if p["kind"] == "NetworkPolicy"
            and p["metadata"].get("namespace", "default") == dest.namespace
            and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
            and selects(p["spec"].get("podSelector"), dest.labels)]


def allowed(policies: list[dict], source: Pod, dest: Pod, port: int, protocol: str = "TCP",
            namespaces: dict[str, dict[str, str]] | None = None) -> bool:
    """Whether a connection from `source` to `dest` on `port` is admitted. `namespaces` maps a
    namespace name to its labels (for namespaceSelector)."""
    selecting = isolating(policies, dest)
    if not selecting:
        return True  # not isolated: Kubernetes admits everything
    ns_labels = namespaces or {}
    return any(_rule_admits(rule, p["metadata"].get("namespace", "default"), source, dest, port, protocol,
                            ns_labels)
               for p in selecting for rule in p["spec"].get("ingress") or [])

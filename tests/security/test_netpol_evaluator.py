"""The NetworkPolicy evaluator itself, on hand-written policies with known answers, so a bug in it
cannot make test_network_policy.py pass by accident."""

from __future__ import annotations

import pytest

from support.network_policy import Pod, allowed, selects

WEB = Pod("web", "shop", {"app": "web", "tier": "front"}, {"http": 8080})
DB = Pod("db", "shop", {"app": "db"}, {"sql": 5432})
SPY = Pod("spy", "other", {"app": "web", "tier": "front"})
NAMESPACES = {"shop": {"team": "a"}, "other": {"team": "b"}}


def policy(spec: dict, namespace: str = "shop") -> dict:
    return {"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": namespace}, "spec": spec}


@pytest.mark.parametrize(("selector", "expected"), [
    ({}, True),
    (None, False),
    ({"matchLabels": {"app": "web"}}, True),
    ({"matchLabels": {"app": "web", "tier": "back"}}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "x"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}, False),
    ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, False),
    ({"matchLabels": {"app": "web"},
      "matchExpressions": [{"key": "zone", "operator": "Exists"}]}, False),
])
def test_label_selectors(selector, expected):
    assert selects(selector, WEB.labels) is expected


def test_unselected_pods_are_not_isolated():
    deny_db = policy({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]})
    assert allowed([deny_db], SPY, WEB, 8080)
    assert not allowed([deny_db], WEB, DB, 5432)


def test_egress_only_policies_do_not_isolate_ingress():
    egress = policy({"podSelector": {}, "policyTypes": ["Egress"]})
    assert allowed([egress], SPY, DB, 5432)


def test_policies_of_another_namespace_do_not_select():
    elsewhere = policy({"podSelector": {}, "policyTypes": ["Ingress"]}, namespace="other")
    assert allowed([elsewhere], SPY, DB, 5432)
    assert not allowed([elsewhere], WEB, SPY, 80)


def test_pod_selector_peers_are_limited_to_the_policy_namespace():
    from_web = policy({"podSelector": {"matchLabels": {"app": "db"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]})
    assert allowed([from_web], WEB, DB, 5432)
    assert not allowed([from_web], SPY, DB, 5432)  # same labels, other namespace


def test_namespace_selector_alone_and_with_a_pod_selector():
    team_b = policy({"podSelector": {}, "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]})
    assert allowed([team_b], SPY, DB, 5432, namespaces=NAMESPACES)
    assert not allowed([team_b], WEB, DB, 5432, namespaces=NAMESPACES)
    both = policy({"podSelector": {}, "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"team": "b"}},
         "podSelector": {"matchLabels": {"app": "x"}}}]}]})
    assert not allowed([both], SPY, DB, 5432, namespaces=NAMESPACES)


def test_ports_numbers_names_ranges_and_protocols():
    ports = policy({"podSelector": {}, "ingress": [{"ports": [
        {"port": 5432}, {"port": "http"}, {"port": 9000, "endPort": 9010},
        {"protocol": "UDP", "port": 53}]}]})
    assert allowed([ports], SPY, DB, 5432)
    assert not allowed([ports], SPY, DB, 5433)
    assert allowed([ports], SPY, WEB, 8080)  # named port of the destination
    assert not allowed([ports], SPY, DB, 8080)  # DB has no port named http
    assert allowed([ports], SPY, DB, 9010) and not allowed([ports], SPY, DB, 9011)
    assert allowed([ports], SPY, DB, 53, "UDP") and not allowed([ports], SPY, DB, 53)


def test_empty_rules_and_rule_lists():
    allow_all = policy({"podSelector": {}, "ingress": [{}]})
    deny_all = policy({"podSelector": {}, "policyTypes": ["Ingress"]})
    assert allowed([allow_all], SPY, DB, 1)
    assert not allowed([deny_all], WEB, DB, 5432)
    assert allowed([deny_all, allow_all], WEB, DB, 5432)  # policies are additive


def test_ip_blocks_match_addresses_in_the_cidr_outside_its_excepts():
    ip = policy({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8",
                                                                      "except": ["10.1.0.0/16"]}}]}]})
    inside, excepted, outside = (Pod("lb", "other", {}, ip=a)
                                 for a in ("10.2.3.4", "10.1.2.3", "192.168.0.1"))
    assert allowed([ip], inside, DB, 5432)
    assert not allowed([ip], excepted, DB, 5432)
    assert not allowed([ip], outside, DB, 5432)
    assert not allowed([ip], WEB, DB, 5432)  # no address: no ipBlock matches it

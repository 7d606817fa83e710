"""The node-access attack (support/specs.py `sniffer`: decode on the host network, tolerating every
taint, on a control-plane node, creating a root-owned file on it) sent to the real kube-apiserver
v1.36.3, with the chart's operator as its admission webhook: refused before anything is stored, at
each field, naming the option to ask the admin for; admitted, with the host-network warning, by an
operator the admin started with the options."""

from __future__ import annotations

import pytest

from pd_operator.api.types import GROUP, PLURAL, VERSION
from support.pdd_cluster import apply, glm
from support.specs import SNIFFER_FIELDS, sniffer

pytestmark = [pytest.mark.security, pytest.mark.integration]

OPTIONS = ("--allow-host-network", "--allow-control-plane-tolerations", "--allow-host-path-creation")


def stored(cp, namespace: str, name: str) -> bool:
    return cp.exists(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}")


def test_the_webhook_refuses_the_sniffer_at_every_field(control_plane, namespace, start_operator):
    start_operator()
    doc = glm(namespace, sniffer())
    refused = apply(control_plane, doc, check=False)
    assert refused.returncode != 0 and "denied the request" in refused.stderr, refused.stderr
    for field in SNIFFER_FIELDS:
        assert f"{field}: " in refused.stderr, (field, refused.stderr)
    for option in OPTIONS:
        assert option in refused.stderr, (option, refused.stderr)
    assert "nodeAccess.hostNetwork" in refused.stderr
    assert not stored(control_plane, namespace, doc["metadata"]["name"])


def test_with_the_admins_options_the_webhook_admits_it(control_plane, namespace, start_operator):
    start_operator(*OPTIONS)
    doc = glm(namespace, sniffer())
    admitted = apply(control_plane, doc)
    assert "Warning: spec.decode.hostNetwork" in admitted.stderr, admitted.stderr
    assert stored(control_plane, namespace, doc["metadata"]["name"])

"""The proxy's membership as whoever can write its ConfigMap would abuse it (issue 34): an entry
sending prompts (and the engines' API key) to an address of their choosing is refused as a whole,
and a document nested too deeply for the JSON parser is a malformed document like any other, never
an exception the caller does not expect. Pure: the membership parser with the deployment's
addresses as pd-proxy gets them from its rendered command (render/proxy.py)."""

from __future__ import annotations

import json

import pytest

from pd_operator.proxy.membership import InstanceAddresses, Upstream, document, parse_document, parse_text
from pd_operator.render import proxy
from support.specs import example, resolve

CTX = resolve(example())
ADDRESSES = InstanceAddresses(CTX.names, CTX.deployment.spec.serving_port)


def _rendered() -> dict:
    return proxy.membership_document(CTX)


def test_the_rendered_membership_is_accepted():
    members = parse_document(_rendered(), ADDRESSES)
    assert len(members.prefill) == CTX.replicas()["prefill"] and members.decode


@pytest.mark.parametrize(("role", "entry"), [
    ("decode", {"url": "http://attacker.example:8000"}),
    ("decode", {"url": "https://glm-flash-decode-0-0.glm-flash-decode-0.default.svc:8000"}),
    ("decode", {"url": "http://glm-flash-decode-0-0.glm-flash-decode-0.other.svc:8000"}),
    ("decode", {"url": "http://glm-flash-decode-0-0.glm-flash-decode-0.default.svc:9999"}),
    ("decode", {"url": "http://glm-flash-decode-0-1.glm-flash-decode-0.default.svc:8000"}),
    ("prefill", {"name": "glm-flash-decode-7"}),
    ("prefill", {"name": "other-prefill-0", "url": "http://other-prefill-0-0.other-prefill-0.default.svc:8000"}),
    ("prefill", {"name": "glm-flash-prefill-01"}),
])
def test_an_entry_outside_the_deployments_instance_addresses_is_refused(role, entry):
    doc = _rendered()
    lists = {r: [dict(e) for e in doc[r]] for r in ("prefill", "decode")}
    lists[role][0].update(entry)
    forged = document(*([Upstream(e["name"], e["url"], e.get("layout", "")) for e in lists[r]]
                        for r in ("prefill", "decode")))
    parse_document(forged)  # well-formed: only the deployment's addresses refuse it
    with pytest.raises(ValueError, match=rf"{role}\[0\]\.(url|name)"):
        parse_document(forged, ADDRESSES)


@pytest.mark.parametrize("text", [b"[" * 200_000 + b"]" * 200_000,
                                  b'{"prefill": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                  b"\xff\xfe", b"null", b'{"version": 1}'])
def test_any_bad_text_is_a_value_error(text):
    with pytest.raises(ValueError):
        parse_text(text, ADDRESSES)


def test_parse_text_reads_what_the_operator_writes():
    data = proxy.membership_data(_rendered())[proxy.KEY]
    assert parse_text(data, ADDRESSES) == parse_document(json.loads(data), ADDRESSES)

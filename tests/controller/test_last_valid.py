"""A spec the controller refuses (it passed the webhook, or there is none) freezes nothing (issue 32):
the instances keep being gated, drained and deleted on the last valid spec, which each valid
reconcile records (controller/last_valid.py), while the status names the refused field. On the real
reconcile with an in-memory API client and a dialer standing in for the pods' ports."""

from __future__ import annotations

import json

import pytest

from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.proxy.membership import KEY, parse_document
from support.controller_fakes import P1, GateDialer, RunningClient, glm_body, link_down, running_pods

REFUSED = ("spec.decode.tensorParallelSize", 3)
"""Decode TP 3 does not divide GLM-5.3-Flash's 64 heads: HeadsNotDivisibleByTP."""


def _refused(prefill: int) -> dict:
    body = glm_body(prefill)
    body["metadata"]["generation"] = 2
    body["spec"]["decode"]["tensorParallelSize"] = REFUSED[1]
    return body


def _membership(client: RunningClient) -> dict[str, list[str]]:
    (cm,) = [m for verb, m in client.writes if verb == "apply" and m["kind"] == "ConfigMap"
             and m["metadata"]["name"] == "glm-flash-proxy"]
    doc = parse_document(json.loads(cm["data"][KEY]))
    return {"prefill": [u.name for u in doc.prefill], "decode": [u.name for u in doc.decode]}


def _children(applied: list[dict]) -> list[dict]:
    by_key = {(m["kind"], m["metadata"]["name"]): m for m in applied}
    return list(by_key.values())


def _deployed(prefill: int) -> tuple[list[dict], list[dict]]:
    """The children a valid reconcile applied (its record of the spec among them) and their pods."""
    first = RunningClient()
    reconcile_mod.reconcile(first, GateDialer(behind=False), glm_body(prefill), [], [])  # type: ignore[arg-type]
    applied = _children([m for verb, m in first.writes if verb in ("apply", "create")])
    assert any(m["metadata"]["name"] == "glm-flash-last-valid-spec" for m in applied)
    pods = running_pods(applied)
    second = RunningClient()
    reconcile_mod.reconcile(second, GateDialer(behind=False), glm_body(prefill), applied, pods)  # type: ignore[arg-type]
    return _children([*applied, *(m for verb, m in second.writes if verb == "apply")]), pods


def test_a_refused_spec_keeps_gating_on_the_last_valid_one():
    applied, pods = _deployed(1)
    down = "glm-flash-decode-0-0"
    pods = [link_down(p) if p["metadata"]["name"] == down else p for p in pods]
    client = RunningClient()
    outcome = reconcile_mod.reconcile(client, GateDialer(behind=False), _refused(1), applied, pods)  # type: ignore[arg-type]
    # The decode instance whose KV link failed leaves the membership; nothing else is rewritten.
    assert _membership(client) == {"prefill": ["glm-flash-prefill-0"], "decode": []}
    assert {m["kind"] for verb, m in client.writes if verb == "apply"} == {"ConfigMap"}
    assert not any(verb in ("delete", "create") for verb, _ in client.writes)
    (status,) = [s for verb, s in client.writes if verb == "status"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "HeadsNotDivisibleByTP"
    assert REFUSED[0] in conds["Ready"]["message"] and "last valid spec" in conds["Ready"]["message"]
    assert conds["KVCompatible"]["status"] == "False" and REFUSED[0] in conds["KVCompatible"]["message"]
    assert conds["Progressing"]["reason"] == "InvalidSpec"
    assert not outcome.ready and not outcome.kv_compatible


def test_a_refused_spec_lets_a_drain_finish():
    """Prefill scaled 2 -> 1 (valid, recorded), then a refused update while prefill 1 drains: the
    drain goes on and, once nothing holds it, its objects go."""
    applied, pods = _deployed(2)
    scaled = RunningClient()
    reconcile_mod.reconcile(scaled, GateDialer(behind=True), glm_body(1), applied, pods)  # type: ignore[arg-type]
    applied = _children([*applied, *(m for verb, m in scaled.writes if verb == "apply")])
    (status,) = [s for verb, s in scaled.writes if verb == "status"]
    body = _refused(1)
    body["status"] = {"draining": status["draining"]}
    gone = RunningClient()
    reconcile_mod.reconcile(gone, GateDialer(behind=False), body, applied, pods)  # type: ignore[arg-type]
    assert f"StatefulSet/{P1}" in {what for verb, what in gone.writes if verb == "delete"}


def test_without_a_record_a_refused_spec_touches_nothing():
    applied, pods = _deployed(1)
    applied = [m for m in applied if m["metadata"]["name"] != "glm-flash-last-valid-spec"]
    client = RunningClient()
    with pytest.raises(reconcile_mod.InvalidSpec):
        reconcile_mod.reconcile(client, GateDialer(behind=False), _refused(1), applied, pods)  # type: ignore[arg-type]
    assert {verb for verb, _ in client.writes} <= {"status", "event"}

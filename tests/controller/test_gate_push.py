"""The reconcile and the decode gates (issue 32): it pushes the membership it writes to every running
decode pod's gate, holds a removed prefill instance while any gate still links it, and deletes it once
every gate reports a membership without it. On the real reconcile with an in-memory API client and a
dialer standing in for the pods' ports (the protocol itself: tests/transfer/test_gate_protocol.py)."""

from __future__ import annotations

from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.proxy.membership import parse_document
from support.controller_fakes import P1, GateDialer, RunningClient, glm_body, running_pods


def test_a_removed_prefill_goes_only_once_every_gate_has_the_membership_without_it():
    first = RunningClient()
    reconcile_mod.reconcile(first, GateDialer(behind=False), glm_body(2), [], [])  # type: ignore[arg-type]
    applied = [m for verb, m in first.writes if verb in ("apply", "create")]
    pods = running_pods(applied)
    decode_pods = sorted(p["metadata"]["name"] for p in pods if "-decode-" in p["metadata"]["name"])

    # the pods run: the membership changes (every instance now routable), so the gates are told
    dialer = GateDialer(behind=False)
    reconcile_mod.reconcile(RunningClient(), dialer, glm_body(2), applied, pods)  # type: ignore[arg-type]
    ((told, document),) = dialer.pushed
    assert told == decode_pods
    assert [u.name for u in parse_document(document).prefill] == ["glm-flash-prefill-0", P1]

    # prefill scaled to 1: a gate still linking prefill 1 holds its drain, whatever the proxies say
    body = glm_body(1)
    held, dialer = RunningClient(), GateDialer(behind=True)
    reconcile_mod.reconcile(held, dialer, body, applied, pods)  # type: ignore[arg-type]
    ((_, document),) = dialer.pushed
    assert [u.name for u in parse_document(document).prefill] == ["glm-flash-prefill-0"]
    assert not any(verb == "delete" and P1 in what for verb, what in held.writes)
    (status,) = [s for verb, s in held.writes if verb == "status"]
    (draining,) = status["draining"]
    assert draining["name"] == P1 and "KV-link gate links it (membership old)" in draining["waitingFor"]

    # every gate reports the membership without it: its objects go
    gone = RunningClient()
    reconcile_mod.reconcile(gone, GateDialer(behind=False), body, applied, pods)  # type: ignore[arg-type]
    deleted = {what for verb, what in gone.writes if verb == "delete"}
    assert f"StatefulSet/{P1}" in deleted


def test_a_steady_deployment_dials_no_gate():
    first = RunningClient()
    reconcile_mod.reconcile(first, GateDialer(behind=False), glm_body(2), [], [])  # type: ignore[arg-type]
    applied = [m for verb, m in first.writes if verb in ("apply", "create")]
    pods = running_pods(applied)
    second = RunningClient()
    reconcile_mod.reconcile(second, GateDialer(behind=False), glm_body(2), applied, pods)  # type: ignore[arg-type]
    now = [m for verb, m in second.writes if verb == "apply"]
    observed = {(m["kind"], m["metadata"]["name"]): m for m in applied}
    observed |= {(m["kind"], m["metadata"]["name"]): m for m in now}
    dialer = GateDialer(behind=False)
    reconcile_mod.reconcile(RunningClient(), dialer, glm_body(2), list(observed.values()), pods)  # type: ignore[arg-type]
    assert dialer.pushed == []

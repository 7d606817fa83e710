"""The KV-link gate's probe-port protocol between the real processes (issue 32): the rendered `kv-link`
command of a decode pod runs `pd-kv-probe gate` with the membership file as the kubelet projects it,
and the operator's own dialer (controller/proxy_state.py) pushes the membership and reads the state,
as the reconcile does. A prefill replacement's drain reads those answers (controller/drain.py).

What stands in for the cluster: the rendered ConfigMaps' files in temporary directories (the file is
replaced atomically, as the kubelet swaps a projected volume, and kept stale on purpose: the
projection lag), POD_IP 127.0.0.1, a free port instead of 8090 and a 1 s period (support/kv_probe.py
Sidecar). The prefill peers are named by their pods' DNS names, which do not resolve here, so every
round fails: this test is about the membership and the state, the pulls are test_kv_link_gate.py's.
"""

from __future__ import annotations

import http.client
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pd_operator.controller import drain
from pd_operator.controller.proxy_state import ProxyStateReader, ProxyUnreachable
from pd_operator.proxy.membership import KEY
from pd_operator.render import render
from pd_operator.render.proxy import every_instance, membership_data, membership_document
from pd_operator.transfer.gate_state import MAX_PUSH_BYTES, MEMBERSHIP_PATH
from support.cluster import pick_port, wait_for
from support.controller_fakes import validated
from support.kv_probe import Sidecar
from support.renders import config_map_data, role_of, serving_sets
from support.specs import example

pytestmark = pytest.mark.transfer

HOST = "127.0.0.1"
TIMEOUT = 120.0  # generous upper bound for a state change on a loaded machine
P0, P1 = "glm-flash-prefill-0", "glm-flash-prefill-1"


def _project(directory: Path, doc: dict) -> None:
    """Replace the mounted file at once, as the kubelet swaps a projected volume's contents."""
    staged = directory / f".{KEY}.new"
    staged.write_text(membership_data(doc)[KEY])
    staged.replace(directory / KEY)


def _rounds_after(dialer: ProxyStateReader, port: int, after: float) -> float:
    """Wait until the gate has counted a round that began after `after`; its start."""
    def later() -> float | None:
        state = dialer.gate(HOST, port)
        at = (state.round or {}).get("at") or 0.0
        return at if at > after else None
    return wait_for("a later gate round", later, TIMEOUT)


def test_the_operator_pushes_membership_and_reads_what_the_gate_applied(tmp_path):
    validation = validated(prefill__replicas=2)
    resolved = validation.resolved
    manifests = render(resolved)
    mounted, members_dir = tmp_path / "etc-pd", tmp_path / "etc-pd-proxy"
    mounted.mkdir()
    members_dir.mkdir()
    for key, text in config_map_data(manifests).items():
        (mounted / key).write_text(text)
    both = membership_document(resolved)
    routable = every_instance(resolved)
    del routable["prefill"][1]
    without_p1 = membership_document(resolved, routable)
    _project(members_dir, both)  # the kubelet's projection, which stays on `both` (its lag)
    (gate_cont,) = [s["spec"]["template"]["spec"]["containers"][1] for s in serving_sets(manifests)
                    if role_of(s) == "decode"]
    assert "--membership" in gate_cont["command"]
    port = pick_port()
    gate = Sidecar(gate_cont, mounted, port, membership=members_dir)
    dialer = ProxyStateReader(deadline_s=10.0)
    try:
        def answering():
            assert gate.proc.poll() is None, gate.proc.stderr.read() if gate.proc.stderr else ""
            try:
                return dialer.gate(HOST, port)
            except ProxyUnreachable:
                return None

        first = wait_for("the gate's state from the mounted file", answering, TIMEOUT)
        assert first.version == both["version"] and first.members == (P0, P1)

        # the replacement of prefill 1: the operator pushes the membership without it
        pushed = dialer.push(HOST, without_p1, port)
        assert pushed.version == without_p1["version"] and pushed.members == (P0,)
        reads = [drain.GateRead("decode-pod", pushed)]
        (prefill_1,) = drain.drains(resolved, {("prefill", 1): P1}, [], None, reads, datetime.now(UTC))
        assert prefill_1.done  # every gate reports a membership without it: its pods may go

        # rounds go on with the stale file; it does not take the gate back
        after = _rounds_after(dialer, port, _rounds_after(dialer, port, 0.0))
        state = dialer.gate(HOST, port)
        assert state.version == without_p1["version"] and state.members == (P0,), state
        assert all(r["peer"].startswith(f"{P0}-0.") for r in state.round["peers"]), state.round

        # the file catches up, then moves to a version never pushed: that is news
        _project(members_dir, without_p1)
        _rounds_after(dialer, port, after)
        assert dialer.gate(HOST, port).members == (P0,)
        routable = every_instance(resolved)
        del routable["prefill"][0]
        only_p1 = membership_document(resolved, routable)
        _project(members_dir, only_p1)
        wait_for("the gate to apply the unpushed file version",
                 lambda: dialer.gate(HOST, port).members == (P1,), TIMEOUT)
        assert dialer.gate(HOST, port).version == only_p1["version"]

        # a document naming another deployment's instance, or too large, is refused; nothing changes
        other_doc = example()
        other_doc["metadata"]["name"] = "other-team"
        other = validated(other_doc).resolved
        with pytest.raises(ProxyUnreachable, match="HTTP 400"):
            dialer.push(HOST, membership_document(other), port)
        # Only the headers go out: the gate refuses by Content-Length without reading the body, and
        # closes; a body still being sent would meet the closed socket (a broken pipe, by timing).
        connection = http.client.HTTPConnection(HOST, port, timeout=10)
        connection.putrequest("POST", MEMBERSHIP_PATH)
        connection.putheader("Content-Length", str(MAX_PUSH_BYTES + 1))
        connection.endheaders()
        answer = connection.getresponse()
        assert answer.status == 413 and "at most" in json.loads(answer.read())["error"]
        connection.close()
        assert dialer.gate(HOST, port).members == (P1,)
    finally:
        gate.stop()


"""The operator's reader of proxy pods' state (controller/proxy_state.py) against servers that
misbehave as a tenant's proxy image could (support/misbehaving.py): each read ends with an answer
or ProxyUnreachable, holds at most about the size cap in memory, and a server slower than the total
deadline is unreachable even when each of its bytes comes well within a socket timeout. Outcomes
only: nothing here measures time."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from pd_operator.controller.proxy_state import ProxyStateReader, ProxyUnreachable
from pd_operator.proxy.membership import ProxyState, UpstreamLoad
from pd_operator.transfer.gate_state import GateState
from support.cluster import pick_port
from support.misbehaving import FLOOD_BYTES, Misbehaving

HOST = "127.0.0.1"
SOUND = (b'{"version": "aaaaaaaaaaaa", '
         b'"upstreams": {"d-1": {"role": "decode", "inflight": 2, "awaitingDecode": 0}}}')
CAP = 1 << 20


def _reader() -> ProxyStateReader:
    # A short deadline keeps the slow cases short; the cap is the product's.
    return ProxyStateReader(deadline_s=0.5, max_bytes=CAP)


def test_a_sound_answer_is_read():
    port = pick_port()
    with Misbehaving(HOST, port, "answer", body=SOUND):
        state = _reader().read(HOST, port)
    assert state == ProxyState("aaaaaaaaaaaa", {"d-1": UpstreamLoad("decode", 2, 0)})


@pytest.mark.parametrize("mode", ["flood", "flood-unsized"])
def test_a_flood_is_cut_at_the_cap_and_never_held(mode):
    port = pick_port()
    fds = len(os.listdir("/proc/self/fd"))
    tracemalloc.start()
    try:
        with Misbehaving(HOST, port, mode) as server:
            with pytest.raises(ProxyUnreachable, match="over the cap of 1048576 bytes") as err:
                _reader().read(HOST, port)
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(os.listdir("/proc/self/fd")) == fds, "the reader kept its connection open"
    assert not err.value.refused
    assert peak < 4 * CAP, f"the reader held {peak} bytes"
    assert server.connections == 1
    # The reader hung up long before the server could send it all (socket buffers hold a few MiB).
    assert server.sent < FLOOD_BYTES // 10, server.sent


def test_a_drip_within_every_socket_timeout_still_ends_at_the_total_deadline():
    """Each byte comes 0.05 s after the last, far within the 0.5 s deadline, but the whole sound
    answer would take seconds: the reader gives up rather than wait for it."""
    port = pick_port()
    with Misbehaving(HOST, port, "drip", body=SOUND, interval=0.05) as server:
        with pytest.raises(ProxyUnreachable, match="no whole answer within 0.5 s") as err:
            _reader().read(HOST, port)
        answer_bytes = len(SOUND) + 90
        assert server.sent < answer_bytes, "the reader waited for the whole drip"
    assert not err.value.refused


def test_a_server_that_never_answers_is_unreachable():
    port = pick_port()
    with Misbehaving(HOST, port, "silent"), pytest.raises(ProxyUnreachable, match="no whole answer") as err:
        _reader().read(HOST, port)
    assert not err.value.refused


def test_json_nested_too_deep_is_an_unexpected_answer_not_a_crash():
    port = pick_port()
    with Misbehaving(HOST, port, "nested"), pytest.raises(ProxyUnreachable, match="unexpected answer"):
        _reader().read(HOST, port)


def test_nothing_listening_is_refused():
    with pytest.raises(ProxyUnreachable) as err:
        _reader().read(HOST, pick_port())
    assert err.value.refused


def test_read_all_reports_each_pod_apart():
    ports = {mode: pick_port() for mode in ("answer", "flood", "drip", "silent")}
    refused = pick_port()
    servers = [Misbehaving(HOST, port, mode, body=SOUND, interval=0.05) for mode, port in ports.items()]
    for server in servers:
        server.__enter__()
    try:
        got = _reader().read_all({**{mode: (HOST, port) for mode, port in ports.items()},
                                  "refused": (HOST, refused)})
    finally:
        for server in servers:
            server.__exit__(None, None, None)
    assert isinstance(got.pop("answer"), ProxyState)
    assert {name: (type(r).__name__, getattr(r, "refused", None)) for name, r in got.items()} == {
        "flood": ("ProxyUnreachable", False), "drip": ("ProxyUnreachable", False),
        "silent": ("ProxyUnreachable", False), "refused": ("ProxyUnreachable", True)}


GATE = (b'{"version": "aaaaaaaaaaaa", "source": "operator", "members": ["d-prefill-0"], "ready": true, '
        b'"failures": 0, "round": null}')


def test_a_push_to_misbehaving_gates_reports_each_apart_within_the_same_bounds():
    """A decode pod's gate runs the tenant's image too: the push has the reader's cap and total
    deadline (issue 32)."""
    ports = {mode: pick_port() for mode in ("answer", "flood", "drip", "silent", "nested")}
    refused = pick_port()
    servers = [Misbehaving(HOST, port, mode, body=GATE, interval=0.05) for mode, port in ports.items()]
    for server in servers:
        server.__enter__()
    try:
        document = {"version": "aaaaaaaaaaaa", "prefill": [], "decode": []}
        got = {name: _push(port, document) for name, port in {**ports, "refused": refused}.items()}
    finally:
        for server in servers:
            server.__exit__(None, None, None)
    answer = got.pop("answer")
    assert isinstance(answer, GateState) and answer.members == ("d-prefill-0",) and answer.ready
    assert {name: (type(r).__name__, getattr(r, "refused", None)) for name, r in got.items()} == {
        "flood": ("ProxyUnreachable", False), "drip": ("ProxyUnreachable", False),
        "silent": ("ProxyUnreachable", False), "nested": ("ProxyUnreachable", False),
        "refused": ("ProxyUnreachable", True)}


def _push(port: int, document: dict) -> GateState | ProxyUnreachable:
    try:
        return _reader().push(HOST, document, port)
    except ProxyUnreachable as err:
        return err

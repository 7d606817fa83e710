"""The KV-link gate's state machine (transfer/gate_state.py), pure: which membership it links by when
the operator's pushes and the kubelet's late file interleave, which round results count, and when one
failed round is not yet unready. The scenario of issue 32: a prefill replacement whose old pods are
deleted while the gate's mounted file still lists them."""

from __future__ import annotations

import json

import pytest

from pd_operator.names import Names
from pd_operator.proxy.membership import Upstream, document, instance_url, parse_document
from pd_operator.transfer.gate_state import (
    FAILURE_THRESHOLD,
    PUSH_HOLDS_S,
    Targets,
    Verdict,
    parse_state,
    state_document,
)

NAMES = Names("glm-flash", "default")
LAYOUT = "l1"
NOW = 1000.0


def _up(role: str, index: int, layout: str = LAYOUT) -> Upstream:
    return Upstream(NAMES.instance(role, index), instance_url(NAMES, role, index, 8000), layout)


def _members(*prefills: int, layout: str = LAYOUT):
    return parse_document(document([_up("prefill", p, layout) for p in prefills], [_up("decode", 0)]))


def _endpoint(p: int) -> str:
    return f"{NAMES.pod_host('prefill', p, 0)}:8090"


def _result(p: int, ok: bool) -> dict:
    return {"peer": _endpoint(p), "ok": ok, "latencyMs": 1.0, "gbps": 1.0, "errors": [] if ok else ["gone"]}


def _round(*results: dict) -> dict:
    return {"ok": bool(results) and all(r["ok"] for r in results), "peers": list(results), "errors": [],
            "at": 0.0}


V01, V1, V12 = _members(0, 1), _members(1), _members(1, 2)


def test_a_push_applies_at_once_and_the_late_file_does_not_take_it_back():
    """The replacement of prefill 0: the operator pushes {1} while the file still says {0, 1}; the
    file then catches up through the same versions and never reinstates 0."""
    t = Targets(layout=LAYOUT)
    assert t.file_read(V01, NOW) and set(t.members()) == {"glm-flash-prefill-0", "glm-flash-prefill-1"}
    assert t.pushed(V1, NOW) and set(t.members()) == {"glm-flash-prefill-1"} and t.source == "operator"
    assert t.pushed(V12, NOW)
    assert not t.file_read(V01, NOW)  # unchanged file
    assert not t.file_read(V1, NOW)  # the projection catching up: an older membership, skipped
    assert set(t.members()) == {"glm-flash-prefill-1", "glm-flash-prefill-2"}
    assert not t.file_read(V12, NOW) and t.membership == V12


def test_a_file_version_never_pushed_is_news():
    """A push that never arrived (the operator restarted, the pod was unreachable): the file's new
    version applies, as it always did."""
    t = Targets(layout=LAYOUT)
    t.pushed(V01, NOW)
    assert not t.file_read(V01, NOW)
    assert t.file_read(V1, NOW) and t.membership == V1 and t.source == "file"
    # a version pushed long ago and consumed since is news again when the file moves to it
    assert t.file_read(V01, NOW) and t.membership == V01


def test_a_push_the_operator_did_not_follow_up_yields_to_the_file_once_old():
    """The membership went {0,1} -> {1} (pushed) -> {0,1} (the push lost) while the projection
    never showed {1}: the unchanged file says {0,1}, and once the push is PUSH_HOLDS_S old the gate
    takes the file again (the projection has caught up with the ConfigMap by then)."""
    t = Targets(layout=LAYOUT)
    t.file_read(V01, NOW)
    t.pushed(V1, NOW)
    assert not t.file_read(V01, NOW + PUSH_HOLDS_S - 1) and t.membership == V1
    assert t.file_read(V01, NOW + PUSH_HOLDS_S) and t.membership == V01 and t.source == "file"


def test_only_prefill_members_on_the_pods_layout_are_peers():
    mixed = parse_document(document([_up("prefill", 0, "old"), _up("prefill", 1, LAYOUT)],
                                    [_up("decode", 0)]))
    t = Targets(layout=LAYOUT)
    t.pushed(mixed, NOW)
    assert t.members() == {"glm-flash-prefill-1": _endpoint(1)}
    assert Targets().members() == {}


def test_one_failed_round_does_not_unready_a_linked_gate():
    v = Verdict()
    assert not v.ready  # not before its first linked round
    v.record(_round(_result(0, False)), None)
    assert not v.ready and v.failures == 1
    v.record(_round(_result(0, True)), None)
    assert v.ready and v.failures == 0
    for n in range(1, FAILURE_THRESHOLD):
        v.record(_round(_result(0, False)), None)
        assert v.ready and v.failures == n
    v.record(_round(_result(0, False)), None)
    assert not v.ready and v.failures == FAILURE_THRESHOLD
    v.record(_round(_result(0, True)), None)
    assert v.ready


def test_a_peer_absent_from_the_newest_membership_is_not_a_peer():
    """The round checked prefill 0 and 1; 0 was removed (pushed) meanwhile and its pods deleted: its
    failure is dropped and the round links."""
    v = Verdict()
    counted = v.record(_round(_result(0, False), _result(1, True)), {_endpoint(1)})
    assert counted["ok"] and counted["peers"] == [_result(1, True)] and counted["dropped"] == 1
    assert v.ready and v.failures == 0
    # every result dropped: the round says nothing either way
    before = v.last
    counted = v.record(_round(_result(0, False)), {_endpoint(1)})
    assert counted["peers"] == [] and v.last is before and v.failures == 0 and v.ready
    # no peer at all is still a failure (a decode with no prefill to link to)
    v.record(_round(), set())
    assert v.failures == 1


def test_the_state_document_round_trips_and_a_malformed_one_names_the_field():
    t = Targets(layout=LAYOUT)
    t.pushed(V1, NOW)
    v = Verdict()
    v.record(_round(_result(1, True)), None)
    answer = json.loads(json.dumps(state_document(t, v, list(t.members()))))
    state = parse_state(answer)
    assert (state.version, state.members) == (V1.version, ("glm-flash-prefill-1",))
    assert (state.ready, state.failures) == (True, 0)
    assert answer["source"] == "operator" and state.round is not None and state.round["ok"]
    for bad, message in (([], "the state is an object"), ({**answer, "version": 1}, "version: a string"),
                         ({**answer, "members": "x"}, "members: a list"),
                         ({**answer, "ready": "yes"}, "ready: true or false"),
                         ({**answer, "failures": -1}, "failures: a count"),
                         ({**answer, "round": {"peers": 3}}, "round: an object")):
        with pytest.raises(ValueError, match=message):
            parse_state(bad)

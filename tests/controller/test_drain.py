"""The drain of instances a scale-down removed (controller/drain.py): which instances depart, what
holds each (the proxies' membership and load, the decode gates' membership for a prefill), when the
bound lets it go, and that only a draining instance's children are kept. Pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pd_operator.controller import drain
from pd_operator.controller.drain import GateRead, ProxyRead
from pd_operator.proxy.membership import ProxyState, UpstreamLoad
from pd_operator.transfer.gate_state import GateState
from support.controller_fakes import OWNER_UID, desired, validated

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
V_NEW = "aaaaaaaaaaaa"
V_OLD = "bbbbbbbbbbbb"
DECODE_1 = "glm-flash-decode-1"
PREFILL_1 = "glm-flash-prefill-1"


def _dep(**changes):
    v = validated(**changes)
    assert v.resolved is not None
    return v.resolved


def _leaving():
    return {("decode", 1): DECODE_1, ("prefill", 1): PREFILL_1}


def _state(version: str | None, **loads: tuple) -> ProxyState:
    """(role, inflight, awaiting decode[, member])."""
    return ProxyState(version, {name.replace("_", "-"): UpstreamLoad(*load) for name, load in loads.items()})


def _gate(pod: str, version: str | None, *members: str) -> GateRead:
    return GateRead(pod, GateState(version, members, True, 0, None))


def _by_name(drains):
    return {d.name: d for d in drains}


def test_departing_is_the_owned_statefulsets_not_among_the_instances_to_run():
    children = desired(validated(prefill__replicas=2, decode__replicas=3))
    assert drain.departing(children, OWNER_UID, {"prefill": {0, 1}, "decode": {0}}) == {
        ("decode", 1): "glm-flash-decode-1", ("decode", 2): "glm-flash-decode-2"}
    # A scale-down mid-surge keeps the new instance past replicas and drains the old one below it.
    assert drain.departing(children, OWNER_UID, {"prefill": {0, 1}, "decode": {0, 2}}) == {
        ("decode", 1): "glm-flash-decode-1"}
    assert drain.departing(children, "someone-else", {"prefill": set(), "decode": set()}) == {}
    terminating = [dict(c, metadata={**c["metadata"], "deletionTimestamp": "2026-12-04T00:00:00Z"})
                   for c in children]
    assert drain.departing(terminating, OWNER_UID, {"prefill": set(), "decode": set()}) == {}


@pytest.mark.parametrize(("read", "holds_decode", "holds_prefill"), [
    # every proxy routes by the new membership and carries nothing on them: both go
    (ProxyRead("p", _state(V_NEW)), None, None),
    # a proxy on an older membership that no longer lists them has let them go too (issue 32: not
    # necessarily the newest version, one without the instance)
    (ProxyRead("p", _state(V_OLD)), None, None),
    # a proxy whose membership still lists them may send them new requests
    (ProxyRead("p", _state(V_OLD, glm_flash_decode_1=("decode", 0, 0),
                           glm_flash_prefill_1=("prefill", 0, 0))),
     "routes by membership bbbbbbbbbbbb, which lists it",
     "routes by membership bbbbbbbbbbbb, which lists it"),
    (ProxyRead("p", _state(None)), "has loaded no membership yet", "has loaded no membership yet"),
    # decode is held by requests in flight; prefill by those and by KV decode has still to pull
    (ProxyRead("p", _state(V_NEW, glm_flash_decode_1=("decode", 2, 0, False))), "2 in flight", None),
    (ProxyRead("p", _state(V_NEW, glm_flash_prefill_1=("prefill", 0, 3, False))), None, "3 awaiting decode"),
    (ProxyRead("p", _state(V_NEW, glm_flash_prefill_1=("prefill", 1, 0, False))), None, "1 in flight"),
    (ProxyRead("p", _state(V_NEW, glm_flash_decode_1=("decode", 0, 0, False))), None, None),
    # unknown is not idle
    (ProxyRead("p", None, "ConnectTimeoutError"), "cannot be read (ConnectTimeoutError)",
     "cannot be read (ConnectTimeoutError)"),
])
def test_what_holds_an_instance(read, holds_decode, holds_prefill):
    got = _by_name(drain.drains(_dep(), _leaving(), [], [read], [], NOW))
    for name, holds in ((DECODE_1, holds_decode), (PREFILL_1, holds_prefill)):
        d = got[name]
        if holds is None:
            assert d.done and not d.timed_out, d
        else:
            assert not d.done and holds in "; ".join(d.waiting_for), d
            assert "proxy pod p" in d.status()["waitingFor"]


@pytest.mark.parametrize("proxies", [[ProxyRead("p", _state(V_NEW))], None])
def test_a_prefill_goes_only_once_every_gate_reports_a_membership_without_it(proxies):
    """The proxies let prefill 1 go at once; a decode gate whose membership (the mounted file, a
    minute late) still lists it would fail its next round on the deleted pods: the drain waits for
    it, with the proxy and without. A decode instance is not held by gates."""
    behind = [_gate("d0", V_NEW, "glm-flash-prefill-0"), _gate("d1", V_OLD, "glm-flash-prefill-0", PREFILL_1),
              GateRead("d2", None, "HTTP 503")]
    got = _by_name(drain.drains(_dep(), _leaving(), [], proxies, behind, NOW))
    assert got[DECODE_1].done and not got[DECODE_1].timed_out
    waits = got[PREFILL_1].waiting_for
    assert waits == (f"decode pod d1's KV-link gate links it (membership {V_OLD})",
                     "decode pod d2's KV-link gate cannot be read (HTTP 503)"), waits
    caught_up = [_gate("d0", V_NEW, "glm-flash-prefill-0"), _gate("d1", V_NEW, "glm-flash-prefill-0")]
    assert _by_name(drain.drains(_dep(), _leaving(), [], proxies, caught_up, NOW))[PREFILL_1].done
    # a gate linking by its configuration (no membership applied) lists every prefill of the spec
    configured = [_gate("d0", None, "glm-flash-prefill-0", PREFILL_1)]
    (held,) = _by_name(drain.drains(_dep(), _leaving(), [], proxies, configured, NOW))[PREFILL_1].waiting_for
    assert held == "decode pod d0's KV-link gate links it (membership none: its configuration)"
    # the bound still lets it go
    began = [{"name": PREFILL_1, "since": NOW.strftime(drain.TIME_FORMAT)}]
    late = _by_name(drain.drains(_dep(), _leaving(), began, proxies, behind, NOW + timedelta(hours=1)))
    assert late[PREFILL_1].done and late[PREFILL_1].timed_out


def test_every_proxy_pod_counts():
    reads = [ProxyRead("p0", _state(V_NEW)),
             ProxyRead("p1", _state(V_NEW, glm_flash_decode_1=("decode", 1, 0, False)))]
    d = _by_name(drain.drains(_dep(), _leaving(), [], reads, [], NOW))[DECODE_1]
    assert not d.done and d.waiting_for == ("1 in flight through proxy pod p1",)


def test_no_proxy_or_no_live_proxy_pod_lets_them_go_at_once():
    for reads in (None, []):
        assert all(d.done and not d.timed_out
                   for d in drain.drains(_dep(), _leaving(), [], reads, [], NOW))


def test_the_bound_is_per_role_and_counts_from_the_recorded_start():
    dep = _dep(scaling={"drain": {"decodeSeconds": 60}},
               kvTransfer={"timeouts": {"abortRequestSeconds": 120}})
    stuck = [ProxyRead("p", _state(V_NEW, glm_flash_decode_1=("decode", 1, 0, False),
                                   glm_flash_prefill_1=("prefill", 0, 1, False)))]
    start = NOW - timedelta(seconds=90)
    previous = [{"name": DECODE_1, "since": start.strftime(drain.TIME_FORMAT)},
                {"name": PREFILL_1, "since": start.strftime(drain.TIME_FORMAT)}]
    got = _by_name(drain.drains(dep, _leaving(), previous, stuck, [], NOW))
    assert got[DECODE_1].done and got[DECODE_1].timed_out  # 90 s >= 60 s
    assert not got[PREFILL_1].done  # 90 s < 120 s
    assert got[PREFILL_1].status()["since"] == "2026-12-04T11:58:30Z"
    assert got[PREFILL_1].status()["deleteBy"] == "2026-12-04T12:00:30Z"
    later = _by_name(drain.drains(dep, _leaving(), previous, stuck, [], NOW + timedelta(seconds=30)))
    assert later[PREFILL_1].done and later[PREFILL_1].timed_out


def test_a_new_drain_starts_now():
    d = _by_name(drain.drains(_dep(), _leaving(), [{"name": "other", "since": "2020-01-01T00:00:00Z"}],
                              [ProxyRead("p", _state(None))], [], NOW))[DECODE_1]
    assert d.since == NOW and d.deadline == NOW + timedelta(seconds=300)


def test_only_a_draining_instances_children_are_held():
    children = desired(validated(prefill__replicas=2, decode__replicas=2))
    busy = ProxyRead("p", _state(V_NEW, glm_flash_decode_1=("decode", 1, 0, False)))
    drains = drain.drains(_dep(), _leaving(), [], [busy], [], NOW)
    held = sorted(f"{c['kind']}/{c['metadata']['name']}" for c in children if drain.held(c, drains))
    assert held == ["Service/glm-flash-decode-1", "StatefulSet/glm-flash-decode-1"]

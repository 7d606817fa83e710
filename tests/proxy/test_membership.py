"""The pure parts of the proxy: the membership document and /pd/state formats
(pd_operator.proxy.membership), who gets the next request (proxy/balancer.py), the PD protocol's
rewrites (proxy/protocol.py), and when the mounted file may be routed by (server.py, watch.py)."""

from __future__ import annotations

import json
import re

import pytest

from pd_operator.proxy.balancer import COOLDOWN_S, MAX_COOLDOWN_S, Balancer
from pd_operator.proxy.membership import (
    ProxyState,
    Upstream,
    UpstreamLoad,
    document,
    parse_document,
    parse_state,
    state_document,
)
from pd_operator.proxy.protocol import EventFramer, decode_request, patch_answer, prefill_request
from pd_operator.proxy.server import Proxy
from pd_operator.proxy.watch import ApiAccess, ConfigMapWatch

P0, P1 = Upstream("d-prefill-0", "http://p0:8000"), Upstream("d-prefill-1", "http://p1:8000")
D0, D1 = Upstream("d-decode-0", "http://d0:8000"), Upstream("d-decode-1", "http://d1:8000/")


def test_the_document_is_sorted_and_versioned_by_content():
    doc = document([P1, P0], [D0])
    assert doc["prefill"] == [{"name": "d-prefill-0", "url": "http://p0:8000"},
                              {"name": "d-prefill-1", "url": "http://p1:8000"}]
    assert doc == document([P0, P1], [D0])
    assert len(doc["version"]) == 12 and int(doc["version"], 16) >= 0
    assert doc["version"] != document([P0, P1], [D0, D1])["version"]
    assert doc["version"] != document([P0, P1], [])["version"]
    # Roles are part of the content: the same instance listed under the other role is another document.
    assert document([P0], [])["version"] != document([], [P0])["version"]
    parsed = parse_document(json.loads(json.dumps(doc)))
    assert (parsed.version, parsed.prefill, parsed.decode) == (doc["version"], (P0, P1), (D0,))
    assert parsed.names() == {"d-prefill-0": "prefill", "d-prefill-1": "prefill", "d-decode-0": "decode"}


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("decode"), "decode: a list of upstreams"),
    (lambda d: d["prefill"].append("p9"), "prefill[2]: an object with name and url"),
    (lambda d: d["decode"][0].update(url="d0:8000"), "decode[0].url: an http(s)://host:port URL"),
    (lambda d: d["decode"][0].update(name=""), "decode[0].name: a non-empty string"),
    (lambda d: d["decode"].append(d["prefill"][0]), "upstream names appear more than once: d-prefill-0"),
    (lambda d: d.update(version="0" * 12), "version: '000000000000' is not the content's"),
    (lambda d: d.pop("version"), "version: None is not the content's"),
])
def test_a_malformed_document_names_the_field(edit, message):
    doc = document([P0, P1], [D0])
    edit(doc)
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_document(doc)


def test_unknown_keys_are_ignored_so_an_older_proxy_reads_a_newer_document():
    doc = {**document([P0], [D0]), "draining": ["d-decode-1"]}
    assert parse_document(doc).decode == (D0,)


def test_the_state_answer_round_trips_and_a_malformed_one_names_the_field():
    state = ProxyState("abc", {"d-prefill-0": UpstreamLoad("prefill", 2, 1),
                               "d-decode-0": UpstreamLoad("decode", 3, 0, member=False)})
    answer = state_document(state)
    assert answer["upstreams"]["d-prefill-0"] == {"role": "prefill", "inflight": 2, "awaitingDecode": 1,
                                                  "member": True}
    assert parse_state(json.loads(json.dumps(answer))) == state
    assert parse_state({"version": None, "upstreams": {}}) == ProxyState(None, {})
    # an answer without `member` (an older proxy) reads as a member: a drain waits rather than guesses
    older = {"version": "v", "upstreams": {"x": {"role": "decode", "inflight": 0, "awaitingDecode": 0}}}
    assert parse_state(older).upstreams["x"].member
    for bad, message in (
            ([], "the state is an object"),
            ({"version": 3, "upstreams": {}}, "version: a string or null"),
            ({"version": "v"}, "upstreams: an object by instance name"),
            ({"version": "v", "upstreams": {"x": {"role": "proxy", "inflight": 0, "awaitingDecode": 0}}},
             "upstreams.x.role"),
            ({"version": "v", "upstreams": {"x": {"role": "decode", "inflight": -1, "awaitingDecode": 0}}},
             "upstreams.x.inflight: a count"),
            ({"version": "v", "upstreams": {"x": {"role": "decode", "inflight": 0}}},
             "upstreams.x.awaitingDecode: a count"),
            ({"version": "v", "upstreams": {"x": {"role": "decode", "inflight": 0, "awaitingDecode": 0,
                                                  "member": "yes"}}},
             "upstreams.x.member: true or false")):
        with pytest.raises(ValueError, match=message):
            parse_state(bad)


def _balancer(prefill, decode, clock=None) -> Balancer:
    b = Balancer(clock) if clock else Balancer()
    b.update(parse_document(document(prefill, decode)))
    return b


def test_a_member_that_failed_rests_before_it_is_picked_first_again():
    now = [100.0]
    b = _balancer([P0, P1], [D0], clock=lambda: now[0])
    b.failed(P0, "prefill")
    assert {b.pick("prefill", set()).name for _ in range(4)} == {"d-prefill-1"}
    assert b.pick("prefill", {"d-prefill-1"}) == P0  # resting, but the only member left to try
    now[0] += COOLDOWN_S
    assert {b.pick("prefill", set()).name for _ in range(4)} == {"d-prefill-0", "d-prefill-1"}
    b.failed(P0, "prefill")  # the second failure in a row (no answer between): twice as long
    now[0] += COOLDOWN_S
    assert {b.pick("prefill", set()).name for _ in range(4)} == {"d-prefill-1"}
    b.answered(P0, "prefill")  # an answer ends the rest
    assert {b.pick("prefill", set()).name for _ in range(4)} == {"d-prefill-0", "d-prefill-1"}
    for _ in range(20):
        b.failed(P0, "prefill")
    now[0] += MAX_COOLDOWN_S
    assert {b.pick("prefill", set()).name for _ in range(4)} == {"d-prefill-0", "d-prefill-1"}
    b.failed(D0, "decode")
    assert b.pick("decode", set()) == D0  # every member rests: still served


def test_least_in_flight_wins_and_ties_go_round_robin():
    b = _balancer([P0, P1], [D0])
    picks = [b.pick("prefill", set()).name for _ in range(4)]
    assert sorted(picks) == ["d-prefill-0", "d-prefill-0", "d-prefill-1", "d-prefill-1"]
    assert picks[0] != picks[1]
    with b.serving(P0, "prefill"):
        assert {b.pick("prefill", set()).name for _ in range(3)} == {"d-prefill-1"}
        assert b.pick("prefill", {"d-prefill-1"}) == P0  # a retry prefers a member not yet tried
    assert b.pick("prefill", {"d-prefill-0", "d-prefill-1"}) in (P0, P1)  # all tried: any member
    assert _balancer([P0], []).pick("decode", set()) is None


def test_prefill_and_decode_pair_only_within_one_kv_layout():
    """Mid-rollout the membership lists old and new instances, each with its layout: a prefill is
    picked only when a decode of its layout is a member, and its decode only of that layout."""
    old_p = Upstream("d-prefill-0", "http://p0:8000", "old")
    new_p = Upstream("d-prefill-1", "http://p1:8000", "new")
    old_d = Upstream("d-decode-0", "http://d0:8000", "old")
    new_d = Upstream("d-decode-1", "http://d1:8000", "new")
    doc = document([old_p, new_p], [old_d, new_d])
    assert parse_document(json.loads(json.dumps(doc))).prefill == (old_p, new_p)  # the layout round-trips
    b = _balancer([old_p, new_p], [old_d, new_d])
    for _ in range(4):
        prefill = b.pick("prefill", set())
        assert prefill is not None
        assert b.pick("decode", set(), prefill.layout).layout == prefill.layout
    lonely = _balancer([old_p, new_p], [new_d])  # the old decode left: the old prefill pairs with none
    assert {lonely.pick("prefill", set()).name for _ in range(4)} == {"d-prefill-1"}
    assert lonely.pick("decode", set(), "old") is None
    assert lonely.listed("prefill") == (old_p, new_p)


def test_layouts_the_document_pairs_as_another_pair_and_stay_out_of_its_version():
    """After a decode-only block-size change prefill keeps its layout's hash and the new decodes carry
    the spec's (render/workloads.py with_running): `pairs` says the new one pairs as the old. It is
    not part of `version` (which names the members), so an older reader still accepts the document."""
    prefill = Upstream("d-prefill-0", "http://p0:8000", "old")
    old_d = Upstream("d-decode-0", "http://d0:8000", "old")
    new_d = Upstream("d-decode-1", "http://d1:8000", "new")
    doc = document([prefill], [new_d], {"new": "old"})
    assert doc["pairs"] == {"new": "old"} and doc["version"] == document([prefill], [new_d])["version"]
    assert "pairs" not in document([prefill], [new_d])
    parsed = parse_document(json.loads(json.dumps(doc)))
    assert parsed.pairs == {"new": "old"} and parsed.paired("new") == "old" == parsed.paired("old")
    b = Balancer()
    b.update(parsed)
    assert b.pick("prefill", set()) == prefill
    assert b.pick("decode", set(), prefill.layout) == new_d
    both = parse_document(document([prefill], [old_d, new_d], {"new": "old"}))
    assert both.pairable("decode", "old") == (old_d, new_d)
    apart = parse_document(document([prefill], [new_d]))  # without pairs: nothing to pair with
    assert apart.pairable("prefill") == () and apart.pairable("decode") == ()
    for bad in ([["new", "old"]], {"new": 1}, "new=old"):
        with pytest.raises(ValueError, match="^pairs: "):
            parse_document({**doc, "pairs": bad})


def test_counts_outlive_membership_until_the_departed_instance_is_idle():
    b = _balancer([P0, P1], [D0, D1])
    with b.serving(D1, "decode"):
        waiting = b.awaiting_decode(P1)
        b.update(parse_document(document([P0], [D0])))
        assert b.members("decode") == (D0,) and {b.pick("decode", set()) for _ in range(3)} == {D0}
        state = b.state()
        assert state.upstreams["d-decode-1"] == UpstreamLoad("decode", 1, 0, member=False)
        assert state.upstreams["d-prefill-1"] == UpstreamLoad("prefill", 0, 1, member=False)
    assert "d-decode-1" not in b.state().upstreams
    waiting.done()
    waiting.done()  # idempotent
    assert set(b.state().upstreams) == {"d-prefill-0", "d-decode-0"}
    assert b.state().upstreams["d-prefill-0"] == UpstreamLoad("prefill", 0, 0)


def test_prefill_is_asked_for_one_token_and_a_remote_decode():
    body = {"model": "m", "prompt": "p", "max_tokens": 50, "max_completion_tokens": 50, "stream": True,
            "stream_options": {"include_usage": True}, "kv_transfer_params": {"x": 1}}
    out = prefill_request(body)
    assert out == {"model": "m", "prompt": "p", "max_tokens": 1, "min_tokens": 1, "max_completion_tokens": 1,
                   "stream": False, "kv_transfer_params": {
                       "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                       "remote_block_ids": None, "remote_host": None, "remote_port": None}}
    assert body["max_tokens"] == 50 and "stream_options" in body  # the client's body is untouched
    assert "max_completion_tokens" not in prefill_request({"prompt": "p"})


def test_decode_gets_the_clients_body_with_prefills_kv_params_only():
    body = {"prompt": "p", "max_tokens": 50, "stream": True}
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [[1]]}
    assert decode_request(body, {"kv_transfer_params": params}) == {**body, "kv_transfer_params": params}
    own = {**body, "kv_transfer_params": {"remote_host": "169.254.169.254", "remote_block_ids": [[9]]}}
    assert decode_request(own, {"kv_transfer_params": params})["kv_transfer_params"] == params
    for answer in ({"choices": []}, {"kv_transfer_params": None}, {"kv_transfer_params": {}}, []):
        with pytest.raises(ValueError, match="not a JSON object|no kv_transfer_params"):
            decode_request(own, answer)  # never the client's own


def test_usage_gets_prefills_cached_tokens_in_whole_answers_and_the_usage_event_only():
    answer = json.dumps({"choices": [{"text": "a"}], "usage": {"prompt_tokens": 5}}).encode()
    assert json.loads(patch_answer(answer, 7))["usage"]["prompt_tokens_details"] == {"cached_tokens": 7}
    assert patch_answer(b"not json", 7) == b"not json"
    token = b'data: {"choices": [{"text": "a"}], "usage": {"prompt_tokens": 5}}'
    usage = (b'data: {"choices": [], "usage": {"prompt_tokens": 5, '
             b'"prompt_tokens_details": {"cached_tokens": 0}}}')
    stream = token + b"\n\n" + usage + b"\n\n" + b"data: [DONE]\n\n"
    framer = EventFramer(7)
    # Bytes arrive in arbitrary pieces; events come out whole, in order.
    out = b"".join(framer.feed(stream[i:i + 5]) for i in range(0, len(stream), 5)) + framer.flush()
    events = out.split(b"\n\n")
    assert events[0] == token and events[2] == b"data: [DONE]" and events[3] == b""
    assert json.loads(events[1][len(b"data: "):])["usage"]["prompt_tokens_details"] == {"cached_tokens": 7}
    tail = EventFramer(7)
    assert tail.feed(b"data: [DO") == b"" and tail.flush() == b"data: [DO"


def test_the_mounted_file_never_takes_the_proxy_back_behind_what_the_watch_applied(tmp_path):
    """The kubelet's projection trails the API: while the watch is down, the file may hold a version
    older than the watched one (a rollout's drained instance still in it). It counts only once the
    watch has been down for longer than the file can lag; before the watch first applied anything,
    at once."""
    now = [0.0]
    path = tmp_path / "upstreams.json"
    proxy = Proxy(path)
    proxy.watch = ConfigMapWatch(ApiAccess("https://api:6443", tmp_path, "ns"), "d-proxy", "upstreams.json",
                                 proxy.apply, file_lag_s=120.0, clock=lambda: now[0])
    old, watched, later = (document([P0, P1], [D0]), document([P0], [D0]), document([P0], [D0, D1]))

    def project(doc: dict) -> None:
        path.write_text(json.dumps(doc))
        proxy.reload()

    project(old)  # the watch has not listed yet: the file is all there is
    assert proxy.balancer.version == old["version"]
    proxy.watch.live = True
    proxy.apply(json.dumps(watched).encode(), proxy.watch.source)
    project(old)
    assert proxy.balancer.version == watched["version"]
    proxy.watch.live = False  # cut at t=0; the kubelet has not caught up
    now[0] = 119.0
    project(old)
    assert proxy.balancer.version == watched["version"]
    now[0] = 120.0  # what the file holds now is at least as new as the watch's last event
    project(later)
    assert proxy.balancer.version == later["version"]
    proxy.watch.live = True
    project(old)
    assert proxy.balancer.version == later["version"]

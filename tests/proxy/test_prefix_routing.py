"""Prefill chosen by expected cached prefix and load, decode by load (proxy/prefix_routing.py,
balancer.py), and what a request is keyed by, its token ids or its text (proxy/prompt_tokens.py).
Pure."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pd_operator.names import Names
from pd_operator.proxy.balancer import RATE_HALF_LIFE_ANSWERS, Balancer
from pd_operator.proxy.membership import InstanceAddresses, Membership, Upstream, document, parse_document
from pd_operator.proxy.metrics import ProxyMetrics
from pd_operator.proxy.prefix_routing import DEFAULT_CACHE_BLOCKS, MODES, PrefixRouter
from pd_operator.proxy.prompt_tokens import CHARS_PER_TOKEN, PromptTokens, prompt_tokens

BLOCK = 16


def prefill(i: int, block: int | None = BLOCK, layout: str = "L", cache: int | None = None) -> Upstream:
    return Upstream(f"d-prefill-{i}", f"http://p{i}:8000", layout, block, cache)


def decode(i: int, layout: str = "L") -> Upstream:
    return Upstream(f"d-decode-{i}", f"http://d{i}:8000", layout)


def membership(prefills: list[Upstream], decodes: list[Upstream]) -> Membership:
    return parse_document(document(prefills, decodes))


def balancer(prefills: list[Upstream], decodes: list[Upstream] | None = None, mode: str = "approximate"
             ) -> Balancer:
    b = Balancer(prefix=mode)  # type: ignore[arg-type]
    b.update(membership(prefills, decodes if decodes is not None else [decode(0)]))
    return b


def prompt_of(b: Balancer, tokens: list[int], salt: str = ""):
    prompt = b.prefix.prompt(PromptTokens(tuple(tokens), salt))
    assert prompt is not None
    return prompt


def route(b: Balancer, tokens: list[int], salt: str = "") -> str:
    """Pick a prefill for `tokens` and serve it there at once (nothing stays in flight)."""
    return routed(b, prompt_of(b, tokens, salt))


def routed(b: Balancer, prompt) -> str:
    """Pick a prefill for `prompt` and serve it there at once."""
    chosen = b.pick("prefill", set(), prompt=prompt)
    assert chosen is not None
    with b.serving(chosen, "prefill", prompt):
        pass
    return chosen.name


def test_a_prompt_goes_back_to_the_prefill_that_computed_its_prefix():
    b = balancer([prefill(0), prefill(1), prefill(2)])
    doc_a, doc_b = [1] * 64, [2] * 64
    first_a = route(b, doc_a + [10] * 5)
    first_b = route(b, doc_b + [11] * 5)
    assert first_a != first_b  # nothing held yet: the cheapest is a tie, broken round robin
    for turn in range(6):
        assert route(b, doc_a + [20 + turn] * 30) == first_a
        assert route(b, doc_b + [40 + turn] * 30) == first_b


def test_a_busy_holder_loses_once_its_queue_costs_more_than_recomputing_the_prefix():
    b = balancer([prefill(0), prefill(1)])
    shared = list(range(160))  # 10 blocks
    holder = route(b, shared)
    other = "d-prefill-1" if holder == "d-prefill-0" else "d-prefill-0"
    members = {u.name: u for u in b.listed("prefill")}
    # A long prefill in flight on the holder: 100 uncached tokens, less than recomputing 160.
    with b.serving(members[holder], "prefill", prompt_of(b, [7] * 100)):
        assert route(b, shared + [1] * 8) == holder
        # Another in flight there: 200 tokens queued, more than the 160 the other would recompute.
        with b.serving(members[holder], "prefill", prompt_of(b, [8] * 100)):
            assert route(b, shared + [2] * 8) == other
    assert b.state().upstreams[holder].inflight == 0
    assert b._loads[holder].pending_tokens == 0


def clocked(prefills: list[Upstream]) -> tuple[Balancer, list[float]]:
    """A balancer on a clock the test sets."""
    now = [0.0]
    b = Balancer(clock=lambda: now[0], prefix="approximate")
    b.update(membership(prefills, [decode(0)]))
    return b, now


def test_a_holder_near_the_end_of_a_long_prefill_wins_once_what_is_left_costs_less():
    b, now = clocked([prefill(0), prefill(1)])
    shared = list(range(160))  # 10 blocks
    holder = routed(b, prompt_of(b, shared))
    other = "d-prefill-1" if holder == "d-prefill-0" else "d-prefill-0"
    members = {u.name: u for u in b.listed("prefill")}
    # The holder computes 1000 tokens in 1 s and answers: its rate is 1000 tokens/s.
    with b.serving(members[holder], "prefill", prompt_of(b, [5] * 1000)):
        now[0] = 1.0
        b.answered(members[holder], "prefill")
    now[0] = 10.0
    with b.serving(members[holder], "prefill", prompt_of(b, [7] * 1000)):
        # Just started: 1000 tokens left there, more than the 168 the other would compute.
        assert b.pick("prefill", set(), prompt=prompt_of(b, shared + [1] * 8)).name == other
        now[0] = 10.95  # about 50 left: less than recomputing the prefix elsewhere
        assert b.pick("prefill", set(), prompt=prompt_of(b, shared + [2] * 8)).name == holder
        now[0] = 12.0  # overdue: nothing is expected left, never less than nothing
        assert b._loads[holder].left_tokens(now[0]) == 0


def test_a_members_rate_counts_each_answered_call_from_its_start_or_the_answer_before():
    b, now = clocked([prefill(0)])
    member = b.listed("prefill")[0]
    load = b._loads[member.name]
    first, second = b.serving(member, "prefill", prompt_of(b, [1] * 1000)), \
        b.serving(member, "prefill", prompt_of(b, [2] * 1000))
    first.__enter__()
    second.__enter__()  # queued behind the first, sent at the same time
    assert load.left_tokens(0.5) == 2000  # no answer yet: no rate, nothing taken off
    now[0] = 1.0
    b.answered(member, "prefill")
    first.__exit__(None, None, None)
    now[0] = 2.0
    b.answered(member, "prefill")
    second.__exit__(None, None, None)
    assert load.rate() == pytest.approx(1000)  # 1000 tokens in 1 s twice, not 2000 over 3 s
    learned = (load.computed_tokens, load.computed_s)
    # A failed call (no answer) or the client's error teaches nothing: it may have computed nothing.
    with b.serving(member, "prefill", prompt_of(b, [3] * 1000)):
        now[0] = 2.01
    with b.serving(member, "prefill", prompt_of(b, [4] * 1000)):
        now[0] = 2.02
        b.answered(member, "prefill", computed=False)
    assert (load.computed_tokens, load.computed_s) == learned


def answer(b: Balancer, now: list[float], member: Upstream, prompt, took_s: float) -> None:
    """`member` computes `prompt` alone in `took_s` and answers."""
    with b.serving(member, "prefill", prompt):
        now[0] += took_s
        b.answered(member, "prefill")


def test_a_members_rate_follows_a_change_of_speed_within_a_few_half_lives():
    b, now = clocked([prefill(0, block=None)])  # no blocks: every call computes its whole prompt
    member, tokens = b.listed("prefill")[0], 1000
    load, prompt, fast_s, slow_s = b._loads[member.name], prompt_of(b, [1] * tokens), 1.0, 4.0
    for _ in range(10 * RATE_HALF_LIFE_ANSWERS):
        answer(b, now, member, prompt, fast_s)
    assert load.rate() == pytest.approx(tokens / fast_s)
    half_lives = 3
    for _ in range(half_lives * RATE_HALF_LIFE_ANSWERS):  # the same member, now 4 times slower
        answer(b, now, member, prompt, slow_s)
    # The fast answers weigh at most 2**-3 of the slow ones' weight: per token, the time it is
    # expected to take is within that part of the slow time.
    old = 0.5 ** half_lives
    assert tokens / slow_s < load.rate() <= tokens / (slow_s * (1 - old) + fast_s * old)
    # What it has left of a call 1 s in is about what it computes at the slow speed.
    with b.serving(member, "prefill", prompt):
        now[0] += 1.0
        assert load.left_tokens(now[0]) == pytest.approx(tokens - tokens / slow_s, rel=0.05)


def test_a_member_relisted_on_other_pods_or_another_layout_learns_its_rate_again():
    b, now = clocked([prefill(0)])
    answer(b, now, b.listed("prefill")[0], prompt_of(b, [1] * 1000), 1.0)
    load = b._loads["d-prefill-0"]
    b.update(membership([prefill(0, cache=8)], [decode(0)]))  # another bound: the same engines
    assert load.rate() == pytest.approx(1000)
    b.update(membership([replace(prefill(0), url="http://p9:8000")], [decode(0)]))
    assert load.rate() is None
    answer(b, now, b.listed("prefill")[0], prompt_of(b, [2] * 1000), 2.0)
    b.update(membership([prefill(0, layout="M")], [decode(0, "M")]))
    assert load.rate() is None


def test_a_routed_prefill_looks_its_prompt_up_once_and_counts_what_the_pick_expected(monkeypatch):
    b = balancer([prefill(0), prefill(1)])
    shared = list(range(160))  # 10 blocks
    holder = route(b, shared)
    lookups = []
    hits = b.prefix.index.hits
    monkeypatch.setattr(b.prefix.index, "hits", lambda *args: lookups.append(args) or hits(*args))
    prompt = prompt_of(b, shared + [1] * 8)
    chosen = b.pick("prefill", set(), prompt=prompt)
    assert chosen is not None and chosen.name == holder
    with b.serving(chosen, "prefill", prompt):
        assert b._loads[holder].pending_tokens == 8  # the prefix it holds is not computed again
    assert len(lookups) == 1  # the pick's, for both members; serving takes the holder's from it


def test_decode_and_requests_without_token_ids_go_by_load():
    b = balancer([prefill(0), prefill(1)], [decode(0), decode(1)])
    route(b, [5] * 64)
    held = {u.name: u for u in b.listed("prefill")}
    # A request without token ids: the fewest in flight, whatever is held.
    busy = held[route(b, [5] * 64)]
    with b.serving(busy, "prefill"):
        chosen = b.pick("prefill", set())
        assert chosen is not None and chosen.name != busy.name
    d0 = b.listed("decode")[0]
    with b.serving(d0, "decode"):
        chosen = b.pick("decode", set(), prompt=prompt_of(b, [5] * 64))
        assert chosen is not None and chosen.name == "d-decode-1"


def route_body(b: Balancer, path: str, body: dict) -> str:
    """Pick a prefill for the request `body` to `path` as pd-proxy reads it, and serve it there."""
    return routed(b, prompt_of_body(b, path, body))


def chat(*turns: str) -> dict:
    return {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
                         for i, text in enumerate(turns)]}


def test_text_prompts_are_keyed_by_their_characters_in_blocks_of_the_engine_block():
    b = balancer([prefill(0), prefill(1), prefill(2)])
    doc = "".join(chr(ord("a") + i % 26) for i in range(CHARS_PER_TOKEN * BLOCK * 3))
    holder = route_body(b, "/v1/completions", {"prompt": doc + " first question"})
    prompt = prompt_of_body(b, "/v1/completions", {"prompt": doc + " second question"})
    # 3 whole blocks of BLOCK tokens, at CHARS_PER_TOKEN characters a token, are held by the holder.
    assert b.prefix.hit_tokens(prompt, b.listed("prefill")) == {
        u.name: 3 * BLOCK if u.name == holder else 0 for u in b.listed("prefill")}
    assert len(prompt) == -(-len(doc + " second question") // CHARS_PER_TOKEN)
    assert route_body(b, "/v1/completions", {"prompt": [doc + " second question"]}) == holder


def test_a_conversations_next_turn_goes_to_the_prefill_that_computed_the_turns_before():
    b = balancer([prefill(0), prefill(1), prefill(2)])
    question = {topic: f"{topic} asked " * BLOCK for topic in ("alpha", "beta", "gamma")}
    firsts = {topic: route_body(b, "/v1/chat/completions", chat(text)) for topic, text in question.items()}
    assert len(set(firsts.values())) == 3  # nothing shared: ties, broken round robin
    for topic, where in firsts.items():
        answer = f"{topic} answered " * BLOCK
        assert route_body(b, "/v1/chat/completions", chat(question[topic], answer, "and then?")) == where
    # A new conversation under a long system prompt another one began with goes where that one went.
    system = "You are terse. " * BLOCK
    first = route_body(b, "/v1/chat/completions", {"messages": [{"role": "system", "content": system},
                                                                 {"role": "user", "content": "one"}]})
    assert route_body(b, "/v1/chat/completions", {"messages": [{"role": "system", "content": system},
                                                                {"role": "user", "content": "two"}]}) == first


def test_text_and_token_ids_never_share_a_key_and_precise_mode_ignores_text():
    b = balancer([prefill(0), prefill(1)])
    text = "q" * (CHARS_PER_TOKEN * BLOCK * 2)
    route_body(b, "/v1/completions", {"prompt": text})
    as_ids = prompt_of(b, [ord(c) for c in text])
    assert set(b.prefix.hit_tokens(as_ids, b.listed("prefill")).values()) == {0}
    precise = balancer([prefill(0), prefill(1)], mode="precise")
    assert precise.prefix.prompt(prompt_tokens("/v1/completions", {"prompt": text})) is None
    assert precise.prefix.prompt(prompt_tokens("/v1/chat/completions", chat(text))) is None
    assert precise.prefix.prompt(prompt_tokens("/v1/completions", {"prompt": [1, 2]})) is not None


def prompt_of_body(b: Balancer, path: str, body: dict):
    prompt = b.prefix.prompt(prompt_tokens(path, body))
    assert prompt is not None
    return prompt


def test_off_is_mains_least_loaded_round_robin():
    b = balancer([prefill(0), prefill(1), prefill(2)], mode="off")
    assert b.prefix.prompt(PromptTokens((1, 2, 3))) is None
    picks = [b.pick("prefill", set()).name for _ in range(6)]  # type: ignore[union-attr]
    assert sorted(picks) == sorted(["d-prefill-0", "d-prefill-1", "d-prefill-2"] * 2)
    assert b.prefix.index.size() == 0
    with pytest.raises(ValueError, match="not one of"):
        PrefixRouter("exact")  # type: ignore[arg-type]
    assert MODES == ("off", "approximate", "precise")


def test_a_member_without_a_block_is_never_scored_by_prefix():
    b = balancer([prefill(0, block=None), prefill(1, block=None)])
    tokens = [3] * 64
    route(b, tokens)
    assert b.prefix.index.size() == 0
    hits = b.prefix.hit_tokens(prompt_of(b, tokens), b.listed("prefill"))
    assert hits == {"d-prefill-0": 0, "d-prefill-1": 0}


def test_salts_keep_prefixes_apart():
    b = balancer([prefill(0), prefill(1)])
    tokens = [9] * 64
    holder = route(b, tokens, salt="tenant-a")
    hits = b.prefix.hit_tokens(prompt_of(b, tokens, "tenant-b"), b.listed("prefill"))
    assert set(hits.values()) == {0}
    hits = b.prefix.hit_tokens(prompt_of(b, tokens, "tenant-a"), b.listed("prefill"))
    assert hits[holder] == 64


def test_capacity_comes_from_the_membership_and_departure_forgets():
    b = balancer([prefill(0, cache=3), prefill(1)])
    assert b.prefix.index.capacity("d-prefill-0") == 3
    assert b.prefix.index.capacity("d-prefill-1") == DEFAULT_CACHE_BLOCKS
    p0 = b.listed("prefill")[0]
    with b.serving(p0, "prefill", prompt_of(b, list(range(160)))):
        pass
    assert b.prefix.index.size("d-prefill-0") == 3
    # Instance 0 leaves: what the index held for it goes with it.
    b.update(membership([prefill(1)], [decode(0)]))
    assert b.prefix.index.size("d-prefill-0") == 0
    # A member whose layout's block changes (a rollout re-listing it) starts empty.
    with b.serving(b.listed("prefill")[0], "prefill", prompt_of(b, list(range(64)))):
        pass
    assert b.prefix.index.size("d-prefill-1") == 4
    b.update(membership([prefill(1, block=32, layout="M")], [decode(0, "M")]))
    assert b.prefix.index.size() == 0
    b.prefix.forget(b.listed("prefill")[0])  # a reset prefix cache


def test_two_layouts_at_once_each_hashed_at_its_own_block():
    old, new = prefill(0, block=640, layout="old"), prefill(1, block=1152, layout="new")
    b = balancer([old, new], [decode(0, "old"), decode(1, "new")])
    tokens = list(range(2304))
    prompt = prompt_of(b, tokens)
    with b.serving(old, "prefill", prompt):
        pass
    with b.serving(new, "prefill", prompt):
        pass
    hits = b.prefix.hit_tokens(prompt_of(b, tokens), [old, new])
    assert hits == {"d-prefill-0": 1920, "d-prefill-1": 2304}  # 3 x 640, 2 x 1152
    # Prompt keys were computed once per block size.
    assert sorted(prompt._keys) == [640, 1152]


@pytest.mark.parametrize(("path", "body", "want"), [
    ("/v1/completions", {"prompt": [1, 2, 3]}, PromptTokens([1, 2, 3])),
    ("/v1/completions", {"prompt": [[1, 2, 3]], "cache_salt": "s"}, PromptTokens([1, 2, 3], "s")),
    ("/v1/completions", {"prompt": [[1, 2], [3]]}, None),  # a batch: no single prefix
    ("/v1/completions", {"prompt": "text"}, PromptTokens("text")),
    ("/v1/completions", {"prompt": ["text"], "cache_salt": "s"}, PromptTokens("text", "s")),
    ("/v1/completions", {"prompt": ["a", "b"]}, None),  # a batch of texts
    ("/v1/completions", {"prompt": ""}, None),
    ("/v1/completions", {"prompt": []}, None),
    ("/v1/completions", {"prompt": ["1", 2]}, None),  # a string first: a batch of texts
    # Ids are not checked one by one (vLLM does): 1, 1.0 and true are the id vLLM reads as 1, and a
    # prompt vLLM rejects (-1) fails wherever it goes.
    ("/v1/completions", {"prompt": [1, True, 1.0]}, PromptTokens([1, 1, 1])),
    ("/v1/completions", {"prompt": [1, -1]}, PromptTokens([1, -1])),
    ("/v1/completions", {"prompt": [1, 2], "cache_salt": 5}, PromptTokens([1, 2])),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, PromptTokens("\0user\0hi")),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "h"},
                                                                      {"type": "text", "text": "i"}]}]},
     PromptTokens("\0user\0hi")),
    ("/v1/chat/completions", {"messages": []}, None),
    ("/v1/chat/completions", {"prompt": [1, 2]}, None),
    ("/v1/models", {"prompt": [1, 2]}, None),
])
def test_what_a_request_is_keyed_by(path, body, want):
    assert prompt_tokens(path, body) == want


def test_a_prompts_ids_are_keyed_where_the_body_holds_them():
    """No copy of the ids on a request's path (test_prefix_index: a list keys as its tuple does)."""
    ids = [7, 8, 9]
    assert prompt_tokens("/v1/completions", {"prompt": ids}).tokens is ids
    assert prompt_tokens("/v1/completions", {"prompt": [ids]}).tokens is ids


def test_the_membership_carries_each_prefills_block_capacity_and_publishers():
    names = Names("d", "ns")
    entry = Upstream("d-prefill-1", "http://d-prefill-1-0.d-prefill-1.ns.svc:8000", "L", 640, 4096,
                     ("tcp://d-prefill-1-0.d-prefill-1.ns.svc:5557", "tcp://d-prefill-1-1.d-prefill-1.ns.svc:5558"))
    doc = json.loads(json.dumps(document([entry], [])))
    assert doc["prefill"][0] == {"name": "d-prefill-1", "url": entry.url, "layout": "L", "blockTokens": 640,
                                 "cacheBlocks": 4096, "events": list(entry.events)}
    assert parse_document(doc, InstanceAddresses(names, 8000)).prefill == (entry,)
    # Each field is part of the version: a new block is a new document.
    assert document([entry], [])["version"] != document([replace(entry, block_tokens=1152)], [])["version"]
    for key, bad in (("blockTokens", 0), ("blockTokens", "640"), ("cacheBlocks", True), ("events", "tcp://x:1"),
                     ("events", ["http://x:1"]), ("events", ["tcp://x"]), ("events", ["tcp://x:99999"])):
        broken = {**doc, "prefill": [{**doc["prefill"][0], key: bad}]}
        with pytest.raises(ValueError, match=rf"prefill\[0\]\.{key}"):
            parse_document(broken)
    # A publisher must be one of the instance's own pods: not another instance's, not another host.
    for endpoint in ("tcp://d-prefill-0-0.d-prefill-0.ns.svc:5557", "tcp://evil.example:5557",
                     "tcp://d-prefill-1-x.d-prefill-1.ns.svc:5557", "tcp://d-prefill-1-0.d-prefill-1.other.svc:5557"):
        moved = document([replace(entry, events=(endpoint,))], [])
        with pytest.raises(ValueError, match=r"prefill\[0\]\.events\[0\]"):
            parse_document(moved, InstanceAddresses(names, 8000))


def test_the_metrics_port_shows_what_the_index_holds_and_each_publishers_resyncs():
    samples = lambda b: {(s.name, tuple(s.labels.values())): s.value  # noqa: E731
                         for f in text_string_to_metric_families(
                             ProxyMetrics(b.state, lambda: b.prefix).exposition().decode())
                         for s in f.samples}
    b = balancer([prefill(0), prefill(1)])
    held = route(b, [4] * (3 * BLOCK))
    assert samples(b)[("pd_proxy_prefix_index_blocks", (held,))] == 3
    precise = balancer([replace(prefill(0), events=("tcp://p0:5557",))], mode="precise")
    (feed,) = precise.prefix.feeds.values()
    feed.receive(0, b"not a batch")
    feed.receive(1, b"not a batch either")
    assert samples(precise)[("pd_proxy_kv_events_resyncs_total", ("d-prefill-0/dp0",))] == 2

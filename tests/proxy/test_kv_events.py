"""Precise prefix routing (pd_operator.proxy.kv_events): vLLM-format KV events (as the caching fakes
publish them, tests/support/kv_events.py, whose bytes the contract tier checks against vLLM 0.34's own
classes) decoded and indexed per publisher; gaps, reordering and restarts resync; departure drops;
two layouts; salts. The last test runs a real ZMQ publisher process and pd-proxy's subscriptions."""

from __future__ import annotations

import asyncio
import random

import pytest

from pd_operator.proxy.kv_events import Cleared, Feed, Removed, Stored, Subscriptions, decode_batch
from pd_operator.proxy.membership import Upstream, document, parse_document
from pd_operator.proxy.prefix_index import PrefixIndex, block_keys
from pd_operator.proxy.prefix_routing import PrefixRouter, Prompt
from pd_operator.proxy.prompt_tokens import PromptTokens
from support.caching_engine import PrefixCache, block_hashes
from support.cluster import pick_port
from support.fakevllm import HOST
from support.kv_events import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Publisher, encode

BLOCK = 4


def payload(*events) -> bytes:
    return encode(Batch(1.0, list(events), 0))


def test_batches_decode_as_vllm_encodes_them():
    big = 2**64 - 5
    events = decode_batch(payload(
        BlockStored([big, 7], None, list(range(8)), 4, extra_keys=[("salt-a",), None], group_idx=0),
        BlockStored([b"\x01" * 32], big, [1, 2, 3, 4], 4, lora_id=2, lora_name="adapter"),
        BlockStored([9], None, [1, 2, 3, 4], 4, extra_keys=[(["mm-hash", 0],)]),
        BlockRemoved([big, b"\x02" * 32], medium=None), AllBlocksCleared()))
    assert events == [Stored((big, 7), None, tuple(range(8)), 4, False, "salt-a"),
                      Stored((b"\x01" * 32,), big, (1, 2, 3, 4), 4, True, ""),
                      Stored((9,), None, (1, 2, 3, 4), 4, True, ""),
                      Removed((big, b"\x02" * 32)), Cleared()]
    assert decode_batch(encode(Batch(0.0, [], None))) == []


@pytest.mark.parametrize("bad", [b"", b"\xc1", b"\x93\x01", encode(Batch(0, [], 0))[:-1],
                                 b"\x92\x01\x91\x81\xa4type\xa3Odd",
                                 payload(BlockStored([1], None, [1, 2, 3], 4))])
def test_a_batch_that_does_not_decode_is_refused(bad):
    with pytest.raises(ValueError):
        decode_batch(bad)


def fed(block: int = BLOCK, capacity: int = 100) -> tuple[PrefixIndex, Feed]:
    index = PrefixIndex(capacity)
    return index, Feed(index, "p0/dp0", block)


def hits(index: PrefixIndex, tokens: list[int], block: int = BLOCK, salt: str = "") -> int:
    return index.hits(block_keys(tokens, block, salt), ["p0/dp0"])["p0/dp0"]


def test_what_the_engine_caches_is_what_the_index_holds():
    """An engine's LRU cache (the caching fakes') admitting random prompts with shared prefixes: after
    each batch the index's hit for every prompt seen equals the engine's own."""
    rng = random.Random(3)
    engine = PrefixCache(BLOCK, 12)
    index, feed = fed(capacity=12)
    stems = [[rng.randrange(1000) for _ in range(BLOCK * 3)] for _ in range(3)]
    seen = []
    for seq in range(60):
        tokens = rng.choice(stems)[: BLOCK * rng.randrange(0, 4)] + [rng.randrange(1000) for _ in range(9)]
        seen.append(tokens)
        feed.receive(seq, payload(*engine.admit(block_hashes(tokens, BLOCK), tokens).events))
        for prompt in seen:
            assert hits(index, prompt) == engine.hit_blocks(block_hashes(prompt, BLOCK))
    assert feed.resyncs == 0 and index.size("p0/dp0") == len(engine)


def test_removed_and_cleared_blocks_are_no_longer_held():
    index, feed = fed()
    tokens = list(range(12))
    h = block_hashes(tokens, BLOCK)
    feed.receive(0, payload(BlockStored(h, None, tokens, BLOCK)))
    assert hits(index, tokens) == 3
    feed.receive(1, payload(BlockRemoved([h[1]])))
    assert hits(index, tokens) == 1
    feed.receive(2, payload(AllBlocksCleared()))
    assert hits(index, tokens) == 0 and index.size() == 0


def test_blocks_it_cannot_key_are_skipped_never_recut():
    index, feed = fed()
    tokens = list(range(16))
    h = block_hashes(tokens, 8)
    feed.receive(0, payload(BlockStored(h, None, tokens, 8)))  # 8-token blocks for a 4-token layout
    feed.receive(1, payload(BlockStored([5], 12345, [1, 2, 3, 4], BLOCK)))  # a parent never seen
    feed.receive(2, payload(BlockStored([6], None, [1, 2, 3, 4], BLOCK, lora_name="a", lora_id=1)))
    assert index.size() == 0 and feed.skipped == 4


def test_salts_never_share():
    index, feed = fed()
    tokens = list(range(8))
    feed.receive(0, payload(BlockStored(block_hashes(tokens, BLOCK, "a"), None, tokens, BLOCK,
                                        extra_keys=[("a",), None])))
    assert hits(index, tokens, salt="a") == 2
    assert hits(index, tokens) == 0 and hits(index, tokens, salt="b") == 0


@pytest.mark.parametrize(("order", "breaks"), [([0, 1, 3], 1), ([0, 2, 1], 2), ([0, 1, 0], 1)],
                         ids=["gap", "reordered", "restarted"])
def test_a_break_in_the_sequence_resyncs(order, breaks):
    index, feed = fed()
    first, second = list(range(8)), list(range(100, 108))
    feed.receive(order[0], payload(BlockStored(block_hashes(first, BLOCK), None, first, BLOCK)))
    feed.receive(order[1], payload())
    assert feed.resyncs == (0 if order[1] == 1 else 1)
    feed.receive(order[2], payload(BlockStored(block_hashes(second, BLOCK), None, second, BLOCK)))
    assert feed.resyncs == breaks
    # What was held before the break may have been removed meanwhile: forgotten; what came after is held.
    assert hits(index, first) == 0 and hits(index, second) == 2
    feed.receive(order[2] + 1, b"not msgpack")
    assert feed.resyncs == breaks + 1 and index.size() == 0


def prefill(i: int, ranks: int, block: int | None = BLOCK, layout: str = "L") -> Upstream:
    return Upstream(f"d-prefill-{i}", f"http://p{i}:8000", layout, block, 50,
                    tuple(f"tcp://p{i}-{r}:{5557 + r}" for r in range(ranks)))


def router(*members: Upstream) -> PrefixRouter:
    r = PrefixRouter("precise")
    r.update(parse_document(document(list(members), [])))
    return r


def test_each_rank_feeds_its_own_holder_and_a_member_holds_what_its_best_rank_holds():
    r = router(prefill(0, 2), prefill(1, 1))
    assert sorted(r.feeds) == [("tcp://p0-0:5557", "d-prefill-0/dp0", BLOCK),
                               ("tcp://p0-1:5558", "d-prefill-0/dp1", BLOCK),
                               ("tcp://p1-0:5557", "d-prefill-1/dp0", BLOCK)]
    tokens = list(range(12))
    h = block_hashes(tokens, BLOCK)
    rank1 = r.feeds[("tcp://p0-1:5558", "d-prefill-0/dp1", BLOCK)]
    rank1.receive(0, payload(BlockStored(h[:2], None, tokens[:8], BLOCK)))
    other = r.feeds[("tcp://p1-0:5557", "d-prefill-1/dp0", BLOCK)]
    other.receive(0, payload(BlockStored(h, None, tokens, BLOCK)))
    prompt = Prompt(PromptTokens(tuple(tokens)))
    assert r.hit_tokens(prompt, [prefill(0, 2), prefill(1, 1)]) == {"d-prefill-0": 8, "d-prefill-1": 12}
    assert r.index.capacity("d-prefill-0/dp1") == 50
    # Routing records nothing in precise mode: only the engines' events do.
    r.routed(prefill(0, 2), Prompt(PromptTokens(tuple(range(50, 70)))))
    assert r.index.size() == 5


def test_departure_and_a_new_layout_drop_the_publishers_entries():
    r = router(prefill(0, 1), prefill(1, 1))
    tokens = list(range(8))
    for feed in r.feeds.values():
        feed.receive(0, payload(BlockStored(block_hashes(tokens, BLOCK), None, tokens, BLOCK)))
    kept = r.feeds[("tcp://p1-0:5557", "d-prefill-1/dp0", BLOCK)]
    r.update(parse_document(document([prefill(1, 1)], [])))
    assert list(r.feeds) == [("tcp://p1-0:5557", "d-prefill-1/dp0", BLOCK)]
    # An unchanged member keeps its feed.
    assert r.feeds[("tcp://p1-0:5557", "d-prefill-1/dp0", BLOCK)] is kept
    assert r.index.holders() == ["d-prefill-1/dp0"]
    # Two layouts at once: the new one's blocks are 8 tokens, fed and looked up in its own keys.
    r.update(parse_document(document([prefill(1, 1), prefill(2, 1, block=8, layout="M")], [])))
    feed = r.feeds[("tcp://p2-0:5557", "d-prefill-2/dp0", 8)]
    feed.receive(0, payload(BlockStored(block_hashes(tokens, 8), None, tokens, 8)))
    prompt = Prompt(PromptTokens(tuple(tokens)))
    assert r.hit_tokens(prompt, [prefill(1, 1), prefill(2, 1, block=8, layout="M")]) == {
        "d-prefill-1": 8, "d-prefill-2": 8}
    r.update(parse_document(document([prefill(1, 1, block=8)], [])))  # its block changed: starts empty
    assert r.index.size("d-prefill-1/dp0") == 0
    assert r.feeds[("tcp://p1-0:5557", "d-prefill-1/dp0", 8)] is not kept


def test_subscriptions_follow_a_real_publisher_over_zmq():
    """pd-proxy's SUB socket against a publisher process: stored blocks reach the index, a dropped
    batch is a gap that resyncs, and leaving the membership closes the subscription."""

    async def main() -> None:
        with Publisher(HOST, pick_port(HOST), pick_port(HOST)) as pub:
            index = PrefixIndex(100)
            feed = Feed(index, "p0/dp0", BLOCK)
            subs = Subscriptions()
            subs.follow({(pub.endpoint, "p0/dp0", BLOCK): feed})
            tokens = list(range(12))
            h = block_hashes(tokens, BLOCK)

            async def until(done) -> None:
                # A SUB socket misses what is published before it joined: publish until it arrives.
                for _ in range(500):
                    if done():
                        return
                    await asyncio.sleep(0.02)
                raise AssertionError("the index never caught up with the publisher")

            async def published(events, done) -> None:
                for _ in range(100):
                    pub.publish(events)
                    try:
                        await until(done)
                        return
                    except AssertionError:
                        continue
                raise AssertionError("nothing published arrived")

            await published([BlockStored(h, None, tokens, BLOCK)], lambda: hits(index, tokens) == 3)
            pub.drop(1)
            pub.publish([BlockRemoved([h[2]])])  # lost: the index still says 3
            assert hits(index, tokens) == 3
            other = list(range(50, 58))
            await published([BlockStored(block_hashes(other, BLOCK), None, other, BLOCK)],
                            lambda: hits(index, other) == 2)
            assert feed.resyncs == 1 and hits(index, tokens) == 0  # the gap forgot what may be gone
            assert subs.endpoints == [pub.endpoint]
            subs.close()
            assert subs.endpoints == []
            await until(lambda: index.size() == 0)  # the closed subscription's entries go with it

    asyncio.run(main())

"""The caching fake engines (tests/support/caching_engine.py) and their KV-event publisher processes
(tests/support/kv_events.py) do what routing by cached prefix is tested and benched against: a
bounded LRU prefix cache in the example's resolved blocks, the time model of the cited measurements,
vLLM-shaped events from a process of their own, and a wire a test can drop, delay and reorder.
The wire format itself is checked against vLLM's own classes in tests/contract/test_kv_events_wire.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Iterator

import aiohttp
import pytest

from pd_operator import cli
from pd_operator.api.labels import KV_LAYOUT
from pd_operator.proxy.prefix_routing import DEFAULT_CACHE_BLOCKS
from support.caching_engine import (
    EXAMPLE,
    CachingPrefill,
    PrefixCache,
    block_hashes,
    caching_engines,
    example_kv,
    measured,
    prompt_tokens,
)
from support.cluster import pick_port
from support.fakevllm import HOST, PREFILL_PARAMS, FakeEngine
from support.kv_events import (
    AllBlocksCleared,
    Batch,
    BlockRemoved,
    BlockStored,
    Publisher,
    Wire,
    decode,
    encode,
)

BLOCK = 4


def tokens(*blocks: int) -> list[int]:
    """A prompt of whole BLOCK-token blocks, block b holding tokens b*BLOCK .. b*BLOCK+BLOCK-1."""
    return [b * BLOCK + i for b in blocks for i in range(BLOCK)]


def admit(cache: PrefixCache, prompt: list[int], salt: str | None = None):
    return cache.admit(block_hashes(prompt, cache.block_size, salt), prompt, salt)


# --- the prefix cache ----------------------------------------------------------------------------

def test_hits_are_the_whole_blocks_of_the_shared_prefix():
    cache = PrefixCache(BLOCK, 100)
    assert admit(cache, tokens(1, 2, 3)).hit_blocks == 0
    assert admit(cache, tokens(1, 2, 9)).hit_blocks == 2
    assert admit(cache, tokens(7, 2, 3)).hit_blocks == 0, "a block is cached under its whole prefix"
    partial = tokens(1, 2, 3)[:-1]  # its third block is not full: never cached, never hit
    assert cache.hit_blocks(block_hashes(partial, BLOCK)) == 2
    assert len(block_hashes(partial, BLOCK)) == 2


def test_stored_events_carry_the_new_blocks_tokens_and_parent():
    cache = PrefixCache(BLOCK, 100)
    first = admit(cache, tokens(1, 2))
    (stored,) = first.events
    assert isinstance(stored, BlockStored)
    assert stored.parent_block_hash is None and stored.token_ids == tokens(1, 2)
    assert stored.block_hashes == block_hashes(tokens(1, 2), BLOCK) and stored.block_size == BLOCK
    (second,) = admit(cache, tokens(1, 2, 5)).events
    assert second.parent_block_hash == stored.block_hashes[-1]
    assert second.token_ids == tokens(5)
    assert admit(cache, tokens(1, 2)).events == [], "a full hit stores nothing"


def test_the_cache_holds_its_capacity_and_evicts_least_recently_used_tails_first():
    cache = PrefixCache(BLOCK, 4)
    a, b = tokens(1, 2, 3), tokens(4, 5)
    admit(cache, a)
    admit(cache, b)  # 5 blocks wanted, 4 held: a's tail (block 3) goes first
    assert len(cache) == 4
    hashes_a = block_hashes(a, BLOCK)
    assert cache.hit_blocks(hashes_a) == 2
    admit(cache, a)  # a again: b's tail is now the least recently used
    assert len(cache) == 4 and cache.hit_blocks(hashes_a) == 3
    assert cache.hit_blocks(block_hashes(b, BLOCK)) == 1
    removed = [e for e in admit(cache, tokens(6, 7)).events if isinstance(e, BlockRemoved)]
    assert [h for e in removed for h in e.block_hashes] == [block_hashes(b, BLOCK)[0], hashes_a[2]]
    assert cache.hit_blocks(hashes_a) == 2, "a's head, used last, stays"
    assert all(len(e.block_hashes) == 1 for e in removed), "one BlockRemoved per block, as vLLM's pool"


def test_a_prompt_longer_than_the_cache_keeps_its_head():
    cache = PrefixCache(BLOCK, 2)
    admit(cache, tokens(1, 2, 3, 4))
    assert len(cache) == 2 and cache.hit_blocks(block_hashes(tokens(1, 2, 3, 4), BLOCK)) == 2


def test_different_salts_never_share_a_block():
    cache = PrefixCache(BLOCK, 100)
    salted = admit(cache, tokens(1, 2), salt="tenant-a")
    assert salted.events[0].extra_keys == [("tenant-a",), None], "the salt rides on the first block only"
    assert admit(cache, tokens(1, 2), salt="tenant-b").hit_blocks == 0
    assert admit(cache, tokens(1, 2)).hit_blocks == 0
    assert admit(cache, tokens(1, 2), salt="tenant-a").hit_blocks == 2


def test_prompts_are_token_ids_or_the_bytes_of_text():
    assert prompt_tokens({"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert prompt_tokens({"prompt": "hé"}) == list("hé".encode())
    assert prompt_tokens({"messages": [{"role": "user", "content": "hi"}]}) == list(b"user\nhi\n")


# --- what the example resolves to, and the time model ---------------------------------------------

def test_the_example_block_and_kv_bytes_are_what_pdctl_plan_prints():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["plan", str(EXAMPLE), "-o", "json"])
    plan = json.loads(out.getvalue())
    kv = example_kv()
    assert kv.block_size == plan["prefill"]["engineBlockSize"] == 640
    assert kv.kv_bytes_per_token == plan["transfer"]["bytes"] / plan["transfer"]["promptTokens"]
    assert kv.cache_blocks == DEFAULT_CACHE_BLOCKS, "the example leaves prefillCacheBlocks to the proxy"


def test_the_time_model_reproduces_its_measurements():
    costs = measured()
    # vllm-ascend's run: 4096 uncached tokens in a median TTFT of 713.87 ms, one step 69.49 ms.
    assert costs.prefill_s(4096) == pytest.approx(0.71387)
    assert costs.prefill_s(0) == pytest.approx(0.06949)
    # Mooncake: 40 GB in 40/87 s.
    assert costs.kv_byte_s * 40e9 == pytest.approx(40 / 87)
    assert costs.kv_hop_s(1000) == pytest.approx(1000 * costs.kv_bytes_per_token / 87e9)


# --- the publisher process and its wire ---------------------------------------------------------

@pytest.fixture
def publisher() -> Iterator[Publisher]:
    with Publisher(HOST, pick_port(HOST), pick_port(HOST)) as pub:
        yield pub


def joined(publisher: Publisher, wire: Wire) -> int:
    """Publish empty batches until the SUB socket gets one (a PUB socket drops what it sends before a
    subscriber's connection is up); the seq of the last one sent."""
    for _ in range(200):
        publisher.publish([])
        if (got := wire.receive(0.05)) is not None:
            while (more := wire.receive(0.2)) is not None:
                got = more
            return got[1]
    raise AssertionError("the subscriber never joined")


def test_batches_go_out_numbered_in_order_and_replay_from_the_buffer(publisher):
    with Wire(publisher.endpoint, publisher.replay_endpoint) as wire:
        base = joined(publisher, wire)
        stored = BlockStored([11, 12], None, [1, 2, 3, 4], 2, extra_keys=[None, None], group_idx=0)
        events = [[stored], [BlockRemoved([12], group_idx=0)], [AllBlocksCleared()]]
        for batch in events:
            publisher.publish(batch, ts=1.5)
        got = [wire.receive() for _ in events]
        assert [g[1] for g in got if g] == [base + 1, base + 2, base + 3]
        assert [decode(g[2]).events for g in got if g] == events
        replayed = wire.replay(base + 2)
        assert [(seq, decode(payload).events) for _, seq, payload in replayed] == [
            (base + 2, events[1]), (base + 3, events[2])]


def test_a_dropped_batch_leaves_a_gap_the_replay_fills(publisher):
    with Wire(publisher.endpoint, publisher.replay_endpoint) as wire:
        base = joined(publisher, wire)
        publisher.drop(1)
        lost = publisher.publish([BlockRemoved([1])])
        publisher.publish([BlockRemoved([2])])
        got = wire.receive()
        assert got is not None and got[1] == lost + 1 == base + 2, "the seq jumps over the dropped batch"
        (_, seq, payload), _ = wire.replay(lost)
        assert seq == lost and decode(payload).events == [BlockRemoved([1])]


def test_held_batches_arrive_late_and_out_of_order(publisher):
    with Wire(publisher.endpoint, publisher.replay_endpoint) as wire:
        base = joined(publisher, wire)
        publisher.hold(1)
        publisher.publish([BlockRemoved([1])])
        publisher.publish([BlockRemoved([2])])
        first = wire.receive()
        assert first is not None and first[1] == base + 2
        assert wire.receive(0.2) is None, "the held batch waits for release()"
        publisher.release()
        late = wire.receive()
        assert late is not None and late[1] == base + 1 and decode(late[2]).events == [BlockRemoved([1])]


def test_a_killed_publisher_sends_nothing_more(publisher):
    with Wire(publisher.endpoint, publisher.replay_endpoint) as wire:
        joined(publisher, wire)
        publisher.kill()
        assert publisher.proc is not None and publisher.proc.returncode is not None
        assert wire.receive(0.2) is None


def test_our_decoder_refuses_what_is_not_a_batch():
    with pytest.raises(ValueError, match="not a KVEventBatch"):
        decode(b"\x01")
    with pytest.raises(ValueError, match="unknown KV event type"):
        decode(encode(Batch(0.0, [])).replace(b"\x90", b"\x91\x81\xa4type\xa3Odd"))


# --- a caching prefill over HTTP -------------------------------------------------------------------

def test_a_caching_prefill_reports_its_hits_and_publishes_what_it_cached(publisher):
    asyncio.run(_caching_prefill(publisher))


async def _caching_prefill(publisher: Publisher) -> None:
    block = example_kv().block_size
    engine = CachingPrefill("prefill-0", "prefill", cache=PrefixCache(block, 8), events=publisher)
    await engine.start()
    try:
        with Wire(publisher.endpoint, publisher.replay_endpoint) as wire:
            await asyncio.to_thread(joined, publisher, wire)
            shared = list(range(2 * block))

            async def prefill(prompt: list[int], request_id: str) -> int:
                body = {"model": "fake-model", "prompt": prompt, "max_tokens": 1, "min_tokens": 1,
                        "stream": False, "kv_transfer_params": PREFILL_PARAMS}
                async with aiohttp.ClientSession() as session, session.post(
                        engine.url + "/v1/completions", json=body,
                        headers={"X-Request-Id": request_id}) as resp:
                    answer = await resp.json()
                    assert resp.status == 200, answer
                    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]

            assert await prefill(shared + [1] * (block // 2), "a") == 0
            assert await prefill(shared + [2] * block, "b") == 2 * block
            stored = [decode(m[2]) for m in [wire.receive(), wire.receive()] if m]
            assert [len(b.events[0].block_hashes) for b in stored] == [2, 1]
            assert stored[1].events[0].parent_block_hash == stored[0].events[0].block_hashes[-1]
            assert engine.hits == [(0, 2 * block + block // 2), (2 * block, 3 * block)]
            assert not engine.errors
    finally:
        await engine.stop()


def test_the_kubelet_runs_caching_prefills_publishing_on_the_pods_named_ports():
    make = caching_engines(16, events_ports=("kv-events", "kv-replay"))
    pod = {"status": {"podIP": "127.0.0.9"}, "metadata": {"labels": {KV_LAYOUT: "abc"}}}
    container = {"ports": [{"name": "http", "containerPort": 8000},
                           {"name": "kv-events", "containerPort": 5557},
                           {"name": "kv-replay", "containerPort": 5558}]}
    prefill = make("glm-flash-prefill-0", "prefill", pod, container)
    assert isinstance(prefill, CachingPrefill) and prefill.cache is not None and prefill.events is not None
    assert (prefill.url, prefill.layout) == ("http://127.0.0.9:8000", "abc")
    assert (prefill.cache.block_size, prefill.cache.capacity) == (example_kv().block_size, 16)
    assert (prefill.events.endpoint, prefill.events.replay_endpoint) == ("tcp://127.0.0.9:5557",
                                                                         "tcp://127.0.0.9:5558")
    decode = make("glm-flash-decode-0", "decode", pod, container)
    assert type(decode) is FakeEngine and decode.role == "decode"

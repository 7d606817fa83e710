"""Text and chat requests routed by cached prefix through the real `pd-proxy` process (approximate
mode, proxy/prompt_tokens.py): caching prefill fakes (support/caching_engine.py, which take a text's
bytes as its tokens) report what they found cached, so each conversation's later turns are seen to
reach the prefill holding its earlier ones, and with prefix routing off they are seen not to."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from pd_operator.proxy.membership import document
from support.caching_engine import CachingPrefill, PrefixCache
from support.fakevllm import MODEL, FakeEngine, ProxyProcess, started, swap

pytestmark = pytest.mark.scaling

BLOCK = 16
PREFILLS = 3
CONVERSATIONS = 4
TURNS = 3


def conversation(topic: int, turns: int) -> list[dict]:
    """The messages of conversation `topic` up to its `turns`th user turn, each turn some blocks long."""
    out: list[dict] = []
    for turn in range(turns):
        if turn:
            out.append({"role": "assistant", "content": f"answer {topic}.{turn} " * BLOCK})
        out.append({"role": "user", "content": f"question {topic}.{turn} " * BLOCK})
    return out


async def _later_turns_hit(tmp_path, mode: str) -> tuple[int, int]:
    """(later turns that found their conversation's earlier turns cached, later turns)."""
    prefills = [CachingPrefill(f"prefill-{i}", "prefill", cache=PrefixCache(BLOCK, 10_000))
                for i in range(PREFILLS)]
    decode = FakeEngine("decode-0", "decode")
    await started(*prefills, decode)
    membership = tmp_path / "membership.json"
    swap(membership, document([replace(e.upstream, block_tokens=BLOCK) for e in prefills], [decode.upstream]))
    try:
        argv = ("--prefix-routing", mode)
        async with ProxyProcess.on_loopback(membership, tmp_path / "proxy.log", *argv) as proxy:
            for turn in range(1, TURNS + 1):
                for topic in range(CONVERSATIONS):
                    status, answer = await proxy.post("/v1/chat/completions", {
                        "model": MODEL, "messages": conversation(topic, turn), "max_tokens": 2})
                    assert status == 200, answer
    finally:
        await asyncio.gather(*(e.stop() for e in (*prefills, decode)))
    assert not [problem for e in (*prefills, decode) for problem in e.errors]
    # Each prefill's hits in arrival order; a conversation's first turn is the first CONVERSATIONS.
    served = sorted((r.order, cached) for e in prefills
                    for r, (cached, _prompt) in zip(e.received, e.hits, strict=True))
    later = [cached for _order, cached in served][CONVERSATIONS:]
    return sum(1 for cached in later if cached >= BLOCK), len(later)


def _run(tmp_path, mode: str) -> tuple[int, int]:
    return asyncio.run(_later_turns_hit(tmp_path, mode))


def test_a_conversations_later_turns_reach_the_prefill_holding_its_earlier_ones(tmp_path):
    hit, later = _run(tmp_path, "approximate")
    assert (hit, later) == (CONVERSATIONS * (TURNS - 1),) * 2


def test_without_prefix_routing_later_turns_miss(tmp_path):
    # Round robin over 3 prefills, 4 conversations a round: a conversation's next turn lands one
    # prefill on.
    hit, later = _run(tmp_path, "off")
    assert hit < later

"""Fake prefill engines that cache prefixes, for routing by cached prefix (issue 37).

A `PrefixCache` is an engine's prefix cache as vLLM keeps one: full blocks of `block_size` tokens,
each named by a hash chained from its parent's (a request's first block also carries its
`cache_salt`, vLLM: vllm/v1/core/kv_cache_utils.py `generate_block_hash_extra_keys` @ v0.34.0), at
most `capacity` blocks, the least recently used evicted first (a request's later blocks before its
earlier ones, as vLLM's free queue frees a request's blocks tail first). Admitting a prompt says
how many of its blocks were cached and gives the KV events vLLM's block pool would publish
(`BlockStored` for the new blocks with their tokens and parent, one `BlockRemoved` per evicted
block; group 0 only: the fake models one cache group). The hash function is the fake's own
(blake2b, 64 bits, as vLLM's default integer hashes are 64 bits); a consumer must not depend on it.

`example_kv()` is what the bundled GLM example resolves to: prefill's prefix-cache block (its engine
block, 640 tokens, as `pdctl plan` prints it and the proxy's membership carries it), the blocks one
prefill's cache holds (the membership's bound) and the KV bytes one prompt token moves to decode.
`Costs` are the time model the fakes and bench/routing.py share, each constant from a published
measurement (`measured()`).

`CachingPrefill` is a `FakeEngine` prefill with a `PrefixCache`: it sleeps the modelled prefill time
(scaled by `time_scale`) for the uncached tokens only, reports the cached tokens in
`usage.prompt_tokens_details.cached_tokens`, and hands its events to a `kv_events.Publisher`
process. Prompts are token ids (`prompt` as a list of integers) or text, which this fake reads as
its UTF-8 bytes (one token a byte: a stand-in, not a model's tokenizer).
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cache

from support.fakevllm import FakeEngine
from support.kv_events import BlockRemoved, BlockStored, Event, Publisher
from support.podnet import EngineFactory, plain_engine, pod_port
from support.specs import EXAMPLES, GLM

EXAMPLE = EXAMPLES / GLM


@dataclass(frozen=True)
class ExampleKV:
    block_size: int
    """Prefill's prefix-cache block in tokens, as pd-proxy's membership gives it (640 for the example:
    its engine block, where its prefix hits land)."""
    cache_blocks: int
    """Blocks one prefill's prefix cache holds, as pd-proxy's membership bounds it (the example leaves
    spec.proxy.routing.prefillCacheBlocks unset: the proxy's default)."""
    kv_bytes_per_token: float
    """What one prompt token's KV weighs on the way to decode (the transfer plan's bytes / tokens)."""


@cache
def example_kv() -> ExampleKV:
    """The bundled GLM example as the operator resolves and renders it for pd-proxy (the same code)."""
    from pd_operator.proxy.prefix_routing import DEFAULT_CACHE_BLOCKS
    from pd_operator.render.proxy import upstream
    from support.specs import example, resolve

    ctx = resolve(example(EXAMPLE))
    prefill = upstream(ctx, "prefill", 0, ctx.layout_hash)
    plan = ctx.report.plan
    assert prefill.block_tokens is not None and plan is not None, "the example caches prefixes and plans"
    return ExampleKV(prefill.block_tokens, prefill.cache_blocks or DEFAULT_CACHE_BLOCKS,
                     plan.bytes / plan.prompt_tokens)


@dataclass(frozen=True)
class Costs:
    """Prefill time = `prefill_fixed_s` + `prefill_token_s` per uncached prompt token; the KV hop to
    decode = `kv_byte_s` per byte of the whole prompt's KV (`kv_bytes_per_token` a token)."""

    prefill_fixed_s: float
    prefill_token_s: float
    kv_byte_s: float
    kv_bytes_per_token: float

    def prefill_s(self, uncached_tokens: int) -> float:
        return self.prefill_fixed_s + self.prefill_token_s * uncached_tokens

    def kv_hop_s(self, prompt_tokens: int) -> float:
        return self.kv_byte_s * self.kv_bytes_per_token * prompt_tokens


# Prefill: vllm-ascend's serving benchmark of DeepSeek-R1-W8A8 at TP16 on Ascend, random 4096-token
# prompts at 1 request/s (vllm-project/vllm-ascend commit 0fc9b56d400f6daede1044bb03187a3c106c4eb1,
# its message's "Evaluation", as mirrored at dev.modelhub.org.cn/EngineX/xc-llm-ascend): median TTFT
# 713.87 ms, median TPOT 69.49 ms. The fixed part is one engine step (the TPOT), the per-token part
# the rest of the TTFT over 4096 tokens. KV hop: Mooncake's Transfer Engine moving 40 GB at 87 GB/s
# over 4x200 Gbps RoCE (kvcache-ai/Mooncake: README.md, "Superior performance at scale").
PREFILL_FIXED_S = 0.06949
PREFILL_TOKEN_S = (0.71387 - 0.06949) / 4096
KV_BYTE_S = 1 / 87e9


def measured() -> Costs:
    return Costs(PREFILL_FIXED_S, PREFILL_TOKEN_S, KV_BYTE_S, example_kv().kv_bytes_per_token)


def block_hashes(tokens: list[int] | array, block_size: int, salt: str | None = None) -> list[int]:
    """The chained hashes of the full blocks of `tokens` (the salt in the first block's)."""
    data = tokens if isinstance(tokens, array) else array("q", tokens)
    parent, out = b"", []
    for start in range(0, len(data) - block_size + 1, block_size):
        extra = salt.encode() if start == 0 and salt else b""
        block = data[start:start + block_size].tobytes()
        parent = hashlib.blake2b(parent + block + extra, digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


@dataclass
class Admitted:
    hit_blocks: int
    events: list[Event]


@dataclass
class PrefixCache:
    block_size: int
    capacity: int
    """Blocks it holds at most."""
    _blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)
    """Block hash -> nothing, least recently used first."""

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def hit_blocks(self, hashes: list[int]) -> int:
        """How many leading blocks of a prompt (its `block_hashes`) are cached."""
        n = 0
        while n < len(hashes) and hashes[n] in self._blocks:
            n += 1
        return n

    def admit(self, hashes: list[int], tokens: list[int] | array | None = None,
              salt: str | None = None) -> Admitted:
        """Serve a prompt: its cached prefix is used, its other full blocks are stored (as many as fit
        beside it), least recently used blocks evicted. `tokens` (the prompt's) fill the events."""
        hit = self.hit_blocks(hashes)
        keep = hashes[:self.capacity]
        for h in reversed(keep[:hit]):
            self._blocks.move_to_end(h)
        new = keep[hit:]
        events: list[Event] = []
        while len(self._blocks) + len(new) > self.capacity:
            victim, _ = self._blocks.popitem(last=False)
            events.append(BlockRemoved([victim], group_idx=0))
        for h in reversed(keep):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        if new:
            bs = self.block_size
            span = list(tokens[hit * bs:(hit + len(new)) * bs]) if tokens is not None else []
            keys = [(salt,) if hit + i == 0 and salt else None for i in range(len(new))]
            events.append(BlockStored(new, hashes[hit - 1] if hit else None, span, bs, extra_keys=keys,
                                      group_idx=0))
        return Admitted(hit, events)


def prompt_tokens(body: dict) -> list[int]:
    """A request's prompt as this fake tokenizes it (module docstring)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return prompt
    if isinstance(prompt, str):
        return list(prompt.encode())
    text = "".join(f"{m.get('role')}\n{m.get('content')}\n" for m in body.get("messages") or [])
    return list(text.encode())


@dataclass
class CachingPrefill(FakeEngine):
    cache: PrefixCache | None = None
    costs: Costs | None = None
    time_scale: float = 0.0
    """Model seconds -> seconds slept (0: no sleep)."""
    events: Publisher | None = None
    hits: list[tuple[int, int]] = field(default_factory=list)
    """(cached tokens, prompt tokens) of each prefill, in order."""

    _publishing: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One batch at a time down the publisher's pipe."""

    async def start(self) -> CachingPrefill:
        if self.events is not None and self.events.proc is None:
            await asyncio.to_thread(self.events.start)
        await super().start()
        return self

    async def stop(self) -> None:
        await super().stop()
        if self.events is not None:
            await asyncio.to_thread(self.events.stop)

    async def kill(self) -> None:
        """As a killed engine pod: its HTTP server and its publisher's process both go."""
        await super().kill()
        if self.events is not None:
            await asyncio.to_thread(self.events.kill)

    async def _compute(self, body: dict) -> int:
        assert self.cache is not None
        tokens = prompt_tokens(body)
        admitted = self.cache.admit(block_hashes(tokens, self.cache.block_size, body.get("cache_salt")),
                                    tokens, body.get("cache_salt"))
        cached = admitted.hit_blocks * self.cache.block_size
        self.hits.append((cached, len(tokens)))
        if self.costs is not None and self.time_scale:
            await asyncio.sleep(self.costs.prefill_s(len(tokens) - cached) * self.time_scale)
        if self.events is not None and admitted.events:  # as computed blocks are cached
            async with self._publishing:
                await asyncio.to_thread(self.events.publish, admitted.events)
        return cached


def caching_engines(cache_blocks: int | None = None, costs: Costs | None = None, time_scale: float = 0.0,
                    events_ports: tuple[str, str] | None = None) -> EngineFactory:
    """For `podnet.Kubelet(engine=...)`: each prefill instance's leader pod runs a `CachingPrefill` of
    the example's block size holding `cache_blocks` blocks (the example's bound unless given),
    publishing its events from a process of its own on the pod's IP at the container ports named
    `events_ports` (PUB, replay) when given; decode pods run plain engines."""
    kv = example_kv()

    def engine(instance: str, role: str, pod: dict, container: dict) -> FakeEngine:
        plain = plain_engine(instance, role, pod, container)
        if role != "prefill":
            return plain
        events = None
        if events_ports is not None:
            pub, replay = (pod_port(container, name) for name in events_ports)
            events = Publisher(plain.host, pub, replay)
        return CachingPrefill(instance, role, host=plain.host, port=plain.port, layout=plain.layout,
                              cache=PrefixCache(kv.block_size, cache_blocks or kv.cache_blocks), costs=costs,
                              time_scale=time_scale, events=events)

    return engine

"""Routing by cached prefix on a Mooncake-format trace: TTFT and prefix hits of pd-proxy's prefill choice.

Replays the trace (default: the conversation trace of Mooncake's FAST'25 release, copied to
`bench/traces/`; `--trace PATH` for any file of that format) against 2 prefill and 2 decode
instances of the caching fake (tests/support/caching_engine.py: the GLM example's 640-token prefill
blocks, an LRU prefix cache of as many blocks as pd-proxy's membership for the example bounds a
prefill to (65,536 unless `--cache-blocks`), prefill and KV-hop times from published
measurements). Each `hash_ids` entry is a fixed 512-token block of synthetic token ids, so two
requests share a token prefix exactly as far as their ids agree; the engine hits on whole 640-token
blocks of it.

It is a time-compressed discrete-event simulation, not a wall-clock replay: the modelled seconds
pass on a virtual clock, and every routing decision is made by pd-proxy's own code of this build,
pd_operator.proxy.balancer.Balancer on that clock as pd-proxy runs it (prefill counted in flight
from its call to its answer, and told of each answer, from which it learns the prefill's rate):
`least_loaded` with prefix routing off (fewest requests in flight);
`approximate`, its approximate prefix routing (the requests' token ids as their bodies carry them;
the membership gives each prefill its 640-token block and that bound); and the same with two
proxy replicas taking the requests in turn, each knowing only what it routed. Each prefill instance
serves one request at a time in arrival order; TTFT is the wait, the prefill of the uncached tokens
and the KV hop of the whole prompt to decode. All policies run at one time scale (the factor on the
trace's arrival times), found so that least-loaded's prefill utilisation is 0.75 +- 0.01.
`precise`: its precise prefix routing, the caching fakes' KV events (vLLM's format, our encoder)
handed to pd-proxy's own event feed (proxy/kv_events.py `Feed`) when the prefill that cached the
blocks finishes; `oracle`: the same, each event handed over the moment the engine caches its blocks,
so every decision knows every cache exactly. A second run repeats least-loaded, approximate and
precise with 4 prefill instances, at its own time scale found the same way. The routing overhead is
measured apart, in CPU and wall-clock time, over the trace's first 2000 requests with 64 in flight
at one proxy. Last, a live replay: the trace's first `--live-requests` requests through the real
`pd-proxy` process (approximate prefix routing) to the caching fakes over HTTP on loopback, 64
streams at a time, each answer checked.

Figures:
- requests: requests replayed
- prefills: prefill instances of the main run (decode: 2)
- time_scale: the factor on the trace's arrival times
- least_loaded_prefill_utilisation: prefill busy time over instance time while requests arrive,
  least-loaded routing
- least_loaded_ttft_mean_ms: mean TTFT, least-loaded routing
- least_loaded_ttft_p99_ms: its 99th percentile
- least_loaded_hit_ratio: prompt tokens found cached over prompt tokens, least-loaded routing
- oracle_ttft_mean_ms: mean TTFT, precise routing knowing every cache exactly at each decision
- oracle_ttft_p99_ms: its 99th percentile
- oracle_hit_ratio: prompt tokens found cached over prompt tokens, routed knowing every cache
- oracle_vs_least_loaded_ttft_ratio: oracle_ttft_mean_ms over least_loaded_ttft_mean_ms
- approximate_ttft_mean_ms: mean TTFT, pd-proxy's approximate prefix routing
- approximate_ttft_p99_ms: its 99th percentile
- approximate_hit_ratio: prompt tokens found cached over prompt tokens, approximate routing
- approximate_vs_least_loaded_ttft_ratio: approximate_ttft_mean_ms over least_loaded_ttft_mean_ms
- approximate_hit_ratio_2_proxies: the same with two proxy replicas, each request to one in turn,
  each knowing only what it routed
- precise_ttft_mean_ms: mean TTFT, pd-proxy's precise prefix routing (the engines' KV events)
- precise_ttft_p99_ms: its 99th percentile
- precise_hit_ratio: prompt tokens found cached over prompt tokens, precise routing
- precise_vs_least_loaded_ttft_ratio: precise_ttft_mean_ms over least_loaded_ttft_mean_ms
- routing_overhead_p99_ms: CPU time of pd-proxy's approximate routing decision at 64 requests in
  flight (token ids read from the parsed body, block keys, index, pick, record), 99th percentile: the
  time it adds to a request on a proxy core of its own
- routing_overhead_wall_p99_ms: the same in wall-clock time (on a shared machine, with the waits for
  a core that other processes hold)
- request_body_parse_p99_ms: CPU time of the JSON parse of the same bodies, 99th percentile: pd-proxy
  parses every body whatever its routing (it rewrites the prefill's), so it is not routing overhead;
  printed for scale
- routing_overhead_chat_p99_ms: the same as routing_overhead_p99_ms for the same prompts sent as chat
  requests of one message, 4 characters a token (what pd-proxy reads of a chat request in place of
  the tokenizer and chat template it does not run: proxy/prompt_tokens.py)
- live_replayed_requests: requests of the live replay through the real pd-proxy process
- live_approximate_hit_ratio: prompt tokens the caching fakes found cached over prompt tokens there
- least_loaded_prefill_utilisation_4_prefills: least-loaded's prefill utilisation in a second run
  with 4 prefill instances, at its own time scale chosen the same way
- least_loaded_hit_ratio_4_prefills: least-loaded's hit ratio there
- approximate_hit_ratio_4_prefills: approximate routing's hit ratio there
- precise_hit_ratio_4_prefills: precise routing's hit ratio there
- approximate_vs_least_loaded_ttft_ratio_4_prefills: the TTFT ratio of approximate routing there
- precise_vs_least_loaded_ttft_ratio_4_prefills: the TTFT ratio of precise routing there
- routing_failed_requests: requests the simulations could not route plus requests of the live replay
  that failed (an error, a wrong answer, an engine's protocol error)
"""

from __future__ import annotations

import asyncio
import gzip
import heapq
import itertools
import json
import math
import statistics
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import _paths  # noqa: F401  (tests/ on sys.path)
import aiohttp

from pd_operator.proxy.balancer import Balancer
from pd_operator.proxy.membership import Membership, Upstream, document, parse_document
from pd_operator.proxy.prefix_routing import Prompt, holder
from pd_operator.proxy.prompt_tokens import CHARS_PER_TOKEN, CHAT, COMPLETIONS, PromptTokens, prompt_tokens
from support import bench
from support.caching_engine import CachingPrefill, Costs, PrefixCache, block_hashes, example_kv, measured
from support.fakevllm import MODEL, WAIT_S, FakeEngine, ProxyProcess, started, swap
from support.kv_events import Batch, Event, encode
from support.specs import ROOT

TRACE = ROOT / "bench" / "traces" / "conversation_trace.jsonl.gz"
"""A copy of the shared conversation trace, with its attribution (bench/traces/README.md), so the bench
runs the same in any clone."""
TRACE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` entry (the trace's README)."""
PREFILLS, DECODES = 2, 2
"""Instances of each role (--prefills for more prefill)."""
WIDER_PREFILLS = 4
"""The second run's prefill instances: with 2, least-loaded lands a repeated prefix on the instance
that holds it half the time by chance; with more, less often (docs/benchmarks.md)."""
DECODE_TOKEN_S = 0.06949
"""Decode's time per output token (the same measurement as the prefill's fixed part, its TPOT)."""
UTILISATION, TOLERANCE = 0.75, 0.01
"""Least-loaded's prefill utilisation the time scale is chosen for, and how close it gets."""
STREAMS = 64
LIVE_REQUESTS, LIVE_TIME_SCALE, LIVE_TOKENS = 500, 0.001, 4
"""The live replay: the trace's first requests, wall-clock seconds per modelled second, tokens each."""
OVERHEAD_REQUESTS = 2000
"""The routing overhead is timed over the trace's first requests."""
QUICK = {"requests": 400, "live_requests": 100}


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: list[int]
    hashes: list[int]
    """The engine's block hashes of the prompt."""
    _prompts: dict[int, Prompt] = field(default_factory=dict, compare=False, repr=False)

    def prompt(self, block_size: int) -> Prompt:
        """The request as pd-proxy's prefix routing sees it, its block keys computed once by the
        proxy's own code and kept for every replay; its token ids are not kept (a range stands for
        their count: the keys of `block_size` are all the proxy reads of them)."""
        if block_size not in self._prompts:
            prompt = Prompt(PromptTokens(tuple(self.tokens())))
            prompt.keys(block_size)
            prompt.tokens = PromptTokens(range(self.prompt_tokens))  # type: ignore[arg-type]
            self._prompts[block_size] = prompt
        return self._prompts[block_size]

    def text(self) -> str:
        """The prompt as text of CHARS_PER_TOKEN characters a token, each hash id's block its own."""
        block = TRACE_BLOCK_TOKENS * CHARS_PER_TOKEN
        return "".join(f"{block_id:08x}" * (block // 8) for block_id in self.hash_ids)[
            :self.prompt_tokens * CHARS_PER_TOKEN]

    def tokens(self) -> array:
        """The prompt: each hash id a fixed 512-token block of token ids."""
        out = array("q")
        for block_id in self.hash_ids:
            out.extend(range(block_id * TRACE_BLOCK_TOKENS, (block_id + 1) * TRACE_BLOCK_TOKENS))
        del out[self.prompt_tokens:]
        return out


def read_trace(path: Path, limit: int | None, block_size: int) -> list[Request]:
    """The trace's requests (at most `limit`)."""
    opener = gzip.open if path.suffix == ".gz" else open
    out: list[Request] = []
    with opener(path, "rt") as lines:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            request = Request(row["timestamp"] / 1000, row["input_length"], row["output_length"],
                              row["hash_ids"], [])
            out.append(replace(request, hashes=block_hashes(request.tokens(), block_size)))
            if limit is not None and len(out) >= limit:
                break
    return out


@dataclass
class Prefill:
    upstream: Upstream
    cache: PrefixCache
    queue: list[Callable[[], None]] = field(default_factory=list)
    """What starts each request waiting here, in arrival order."""
    running: bool = False
    busy_s: float = 0.0
    seq: Iterator[int] = field(default_factory=itertools.count)
    """The seq of its next KV-event batch."""


@dataclass(frozen=True)
class Policy:
    """How a replay routes prefill: pd-proxy's prefix routing `mode` ("off": least-loaded) in each of
    `proxies` replicas (request i goes to replica i mod proxies); in precise mode the engines' KV
    events reach the proxy when the prefill that cached the blocks finishes, or (`exact`) the moment
    the engine caches them, before the next routing decision: the oracle."""

    mode: str = "off"
    proxies: int = 1
    exact: bool = False


@dataclass
class Outcome:
    ttft_s: list[float]
    cached_tokens: int
    prompt_tokens: int
    busy_s: float
    window_s: float
    """From the first arrival to the last."""
    failed: int
    prefills: int

    @property
    def utilisation(self) -> float:
        """Prefill work over the instances' time while requests arrive (above 1: it cannot keep up)."""
        return self.busy_s / (self.prefills * self.window_s)

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens

    def ttft_ms(self, q: int | None = None) -> float:
        return 1000 * (statistics.fmean(self.ttft_s) if q is None else percentile(self.ttft_s, q))


def percentile(values: Sequence[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Setup:
    prefills: int
    cache_blocks: int
    block_size: int
    costs: Costs

    def membership(self) -> Membership:
        """The replay's instances as pd-proxy's membership names them (prefill with its engine block
        and cache size)."""
        prefill = [Upstream(f"prefill-{i}", f"http://prefill-{i}:8000", block_tokens=self.block_size,
                            cache_blocks=self.cache_blocks, events=(f"tcp://prefill-{i}:5557",))
                   for i in range(self.prefills)]
        decode = [Upstream(f"decode-{i}", f"http://decode-{i}:8000") for i in range(DECODES)]
        return parse_document(document(prefill, decode))


def simulate(requests: Sequence[Request], scale: float, policy: Policy, setup: Setup) -> Outcome:
    """Replay `requests` with arrivals at `scale` times the trace's; what it took."""
    clock = [0.0]
    costs, block_size = setup.costs, setup.block_size
    membership = setup.membership()
    proxies = [Balancer(clock=lambda: clock[0], prefix=policy.mode) for _ in range(policy.proxies)]
    for proxy in proxies:
        proxy.update(membership)
    prefills = {u.name: Prefill(u, PrefixCache(block_size, setup.cache_blocks)) for u in membership.prefill}
    events: list[tuple[float, int, Callable[[], None]]] = []
    order = itertools.count()
    ttft: list[float] = []
    cached_total = prompt_total = failed = 0

    def at(t: float, action: Callable[[], None]) -> None:
        heapq.heappush(events, (t, next(order), action))

    def start(p: Prefill) -> None:
        p.running = bool(p.queue)
        if p.running:
            p.queue.pop(0)()

    feeds = {key[1]: feed for key, feed in proxies[0].prefix.feeds.items()}
    """Holder -> the feed of its events, in precise mode."""

    def publish(p: Prefill, stored: list[Event]) -> Callable[[], None]:
        """What hands `p`'s batch of `stored` to the proxy's feed of it (vLLM numbers them in order)."""
        seq, payload = next(p.seq), encode(Batch(clock[0], stored, 0))
        feed = feeds[holder(p.upstream.name, 0)]
        return lambda: feed.receive(seq, payload)

    def arrive(index: int) -> None:
        nonlocal failed
        request = requests[index]
        proxy = proxies[index % len(proxies)]
        prompt = request.prompt(block_size) if policy.mode != "off" else None
        upstream = proxy.pick("prefill", set(), prompt=prompt)
        if upstream is None:
            failed += 1
            return
        serving = proxy.serving(upstream, "prefill", prompt)
        serving.__enter__()
        p = prefills[upstream.name]
        delivered: Callable[[], None] | None = None

        def compute() -> None:
            nonlocal cached_total, prompt_total, delivered
            admitted = p.cache.admit(request.hashes, request.tokens() if feeds else None)
            delivered = publish(p, admitted.events) if feeds and admitted.events else None
            if delivered is not None and policy.exact:
                delivered()
                delivered = None
            cached = admitted.hit_blocks * block_size
            cached_total += cached
            prompt_total += request.prompt_tokens
            took = costs.prefill_s(request.prompt_tokens - cached)
            p.busy_s += took
            at(clock[0] + took, finish)

        def finish() -> None:
            nonlocal failed
            if delivered is not None:
                delivered()
            proxy.answered(upstream, "prefill")
            serving.__exit__(None, None, None)
            decode = proxy.pick("decode", set())
            if decode is None:
                failed += 1
            else:
                decoding = proxy.serving(decode, "decode")
                decoding.__enter__()
                hop = costs.kv_hop_s(request.prompt_tokens)
                ttft.append(clock[0] + hop - request.arrival_s * scale)
                at(clock[0] + hop + request.output_tokens * DECODE_TOKEN_S,
                   lambda: decoding.__exit__(None, None, None))
            start(p)

        p.queue.append(compute)
        if not p.running:
            start(p)

    for i, request in enumerate(requests):
        at(request.arrival_s * scale, lambda i=i: arrive(i))
    window = (requests[-1].arrival_s - requests[0].arrival_s) * scale if requests else 0.0
    while events:
        clock[0], _, action = heapq.heappop(events)
        action()
    busy = sum(p.busy_s for p in prefills.values())
    return Outcome(ttft, cached_total, max(prompt_total, 1), busy, max(window, 1e-9), failed, setup.prefills)


@dataclass
class Overhead:
    """Per request of the overhead run, seconds."""

    cpu_s: list[float] = field(default_factory=list)
    """The routing decision's CPU time (the thread's)."""
    wall_s: list[float] = field(default_factory=list)
    """The same in wall-clock time."""
    parse_s: list[float] = field(default_factory=list)
    """The JSON parse of the request's body (CPU time), which pd-proxy does whatever its routing."""


def routing_overhead(requests: Sequence[Request], setup: Setup, chat: bool = False) -> Overhead:
    """What each approximate routing decision of pd-proxy costs over the trace, from the request's
    parsed body to the recorded pick (its token ids, or with `chat` a chat request's text, read, their
    block keys, the index lookup, the pick, the record), with STREAMS requests in flight at the
    proxy; and the parse of each body."""
    balancer = Balancer(prefix="approximate")
    balancer.update(setup.membership())
    in_flight: deque = deque()
    out = Overhead()
    for request in requests:
        asked = ({"messages": [{"role": "user", "content": request.text()}]} if chat
                 else {"prompt": request.tokens().tolist()})
        data = json.dumps({"model": "m", **asked, "max_tokens": 16}).encode()
        began = time.thread_time()
        body = json.loads(data)
        out.parse_s.append(time.thread_time() - began)
        began, began_wall = time.thread_time(), time.perf_counter()
        prompt = balancer.prefix.prompt(prompt_tokens(CHAT if chat else COMPLETIONS, body))
        upstream = balancer.pick("prefill", set(), prompt=prompt)
        assert upstream is not None
        serving = balancer.serving(upstream, "prefill", prompt)
        serving.__enter__()
        out.cpu_s.append(time.thread_time() - began)
        out.wall_s.append(time.perf_counter() - began_wall)
        in_flight.append(serving)
        if len(in_flight) >= STREAMS:
            in_flight.popleft().__exit__(None, None, None)
    return out


@dataclass
class Live:
    """What the live replay through the real pd-proxy process saw."""

    failed: list[str] = field(default_factory=list)
    answered: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0


async def live_replay(requests: Sequence[Request], setup: Setup, mode: str, workdir: Path) -> Live:
    """The first requests of the trace through a `pd-proxy` process routing with prefix `mode`, to
    caching prefill fakes and decode fakes on loopback (their prefill sleeps the modelled time scaled
    by LIVE_TIME_SCALE), STREAMS at a time; every answer checked."""
    block = setup.block_size
    prefills = [CachingPrefill(f"prefill-{i}", "prefill", cache=PrefixCache(block, setup.cache_blocks),
                               costs=setup.costs, time_scale=LIVE_TIME_SCALE) for i in range(setup.prefills)]
    decodes = [FakeEngine(f"decode-{i}", "decode", chunks=LIVE_TOKENS) for i in range(DECODES)]
    await started(*prefills, *decodes)
    membership = workdir / "membership.json"
    swap(membership, document([replace(e.upstream, block_tokens=block, cache_blocks=setup.cache_blocks)
                               for e in prefills], [e.upstream for e in decodes]))
    out = Live()
    queue = iter(enumerate(requests))
    argv = ("--prefix-routing", mode)
    try:
        async with ProxyProcess.on_loopback(membership, workdir / "proxy.log", *argv) as proxy, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
            async def stream() -> None:
                for i, request in queue:
                    body = {"model": MODEL, "prompt": request.tokens().tolist(), "max_tokens": LIVE_TOKENS}
                    try:
                        async with session.post(proxy.url + "/v1/completions", json=body,
                                                headers={"X-Request-Id": f"r{i}"}) as resp:
                            answer = await resp.json()
                            text = answer["choices"][0]["text"] if resp.status == 200 else None
                    except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as err:
                        out.failed.append(f"r{i}: {type(err).__name__}: {err}")
                        continue
                    if text != "".join(f"t{k} " for k in range(LIVE_TOKENS)):
                        out.failed.append(f"r{i}: HTTP {resp.status}: {str(answer)[:200]}")
                    else:
                        out.answered += 1
            await asyncio.gather(*(stream() for _ in range(STREAMS)))
    finally:
        await asyncio.gather(*(e.stop() for e in (*prefills, *decodes)))
    out.failed += [problem for e in (*prefills, *decodes) for problem in e.errors]
    out.cached_tokens = sum(cached for e in prefills for cached, _ in e.hits)
    out.prompt_tokens = sum(prompt for e in prefills for _, prompt in e.hits)
    return out


def scale_for_utilisation(run: Callable[[float], Outcome], low: float, high: float) -> tuple[float, Outcome]:
    """The arrival-time factor at which least-loaded's prefill utilisation is UTILISATION."""
    target = UTILISATION
    for _ in range(40):
        scale = math.sqrt(low * high)
        outcome = run(scale)
        if abs(outcome.utilisation - target) <= TOLERANCE:
            return scale, outcome
        if outcome.utilisation > target:
            low = scale
        else:
            high = scale
    raise SystemExit(f"no time scale in [{low}, {high}] gives a prefill utilisation of {UTILISATION}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench.parser(__doc__)
    parser.add_argument("--trace", type=Path, default=TRACE,
                        help=f"a Mooncake-format trace (default {TRACE})")
    parser.add_argument("--requests", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--cache-blocks", type=int, default=None,
                        help="each prefill's prefix cache, in engine blocks (default: the example's bound "
                             "as pd-proxy's membership carries it)")
    parser.add_argument("--live-requests", type=int, default=LIVE_REQUESTS,
                        help=f"requests of the live replay through pd-proxy (default {LIVE_REQUESTS})")
    parser.add_argument("--prefills", type=int, default=PREFILLS,
                        help=f"prefill instances (default {PREFILLS}; decode: {DECODES})")
    args = bench.parse(parser, argv, QUICK)
    if not args.trace.is_file():
        print(f"error: no trace at {args.trace}: give a Mooncake-format trace with --trace",
              file=sys.stderr)
        return 2
    kv = example_kv()
    requests = read_trace(args.trace, args.requests, kv.block_size)
    if not requests:
        print(f"error: {args.trace} holds no requests", file=sys.stderr)
        return 2

    setup = Setup(args.prefills, args.cache_blocks or kv.cache_blocks, kv.block_size, measured())

    def run(policy: Policy, on: Setup = setup) -> Callable[[float], Outcome]:
        return lambda scale: simulate(requests, scale, policy, on)

    scale, least = scale_for_utilisation(run(Policy("off")), 1e-3, 1e3)
    wider = replace(setup, prefills=WIDER_PREFILLS)
    wider_scale, wider_least = scale_for_utilisation(run(Policy("off"), wider), 1e-3, 1e3)
    wider_approximate = run(Policy("approximate"), wider)(wider_scale)
    wider_precise = run(Policy("precise"), wider)(wider_scale)
    approximate = run(Policy("approximate"))(scale)
    two_proxies = run(Policy("approximate", proxies=2))(scale)
    precise = run(Policy("precise"))(scale)
    oracle = run(Policy("precise", exact=True))(scale)
    overhead = routing_overhead(requests[:OVERHEAD_REQUESTS], setup)
    chat_overhead = routing_overhead(requests[:OVERHEAD_REQUESTS], setup, chat=True)
    with bench.workdir("routing-") as workdir:
        live = asyncio.run(live_replay(requests[:args.live_requests], setup, "approximate", workdir))
    bench.report(__doc__, {
        "requests": len(requests),
        "prefills": setup.prefills,
        "time_scale": f"{scale:.3f}",
        "least_loaded_prefill_utilisation": f"{least.utilisation:.3f}",
        "least_loaded_ttft_mean_ms": f"{least.ttft_ms():.1f}",
        "least_loaded_ttft_p99_ms": f"{least.ttft_ms(99):.1f}",
        "least_loaded_hit_ratio": f"{least.hit_ratio:.3f}",
        "oracle_ttft_mean_ms": f"{oracle.ttft_ms():.1f}",
        "oracle_ttft_p99_ms": f"{oracle.ttft_ms(99):.1f}",
        "oracle_hit_ratio": f"{oracle.hit_ratio:.3f}",
        "oracle_vs_least_loaded_ttft_ratio": f"{oracle.ttft_ms() / least.ttft_ms():.3f}",
        "approximate_ttft_mean_ms": f"{approximate.ttft_ms():.1f}",
        "approximate_ttft_p99_ms": f"{approximate.ttft_ms(99):.1f}",
        "approximate_hit_ratio": f"{approximate.hit_ratio:.3f}",
        "approximate_vs_least_loaded_ttft_ratio": f"{approximate.ttft_ms() / least.ttft_ms():.3f}",
        "approximate_hit_ratio_2_proxies": f"{two_proxies.hit_ratio:.3f}",
        "routing_overhead_p99_ms": f"{1000 * percentile(overhead.cpu_s, 99):.3f}",
        "routing_overhead_wall_p99_ms": f"{1000 * percentile(overhead.wall_s, 99):.3f}",
        "request_body_parse_p99_ms": f"{1000 * percentile(overhead.parse_s, 99):.3f}",
        "routing_overhead_chat_p99_ms": f"{1000 * percentile(chat_overhead.cpu_s, 99):.3f}",
        "live_replayed_requests": live.answered + len(live.failed),
        "live_approximate_hit_ratio": f"{live.cached_tokens / max(live.prompt_tokens, 1):.3f}",
        "precise_ttft_mean_ms": f"{precise.ttft_ms():.1f}",
        "precise_ttft_p99_ms": f"{precise.ttft_ms(99):.1f}",
        "precise_hit_ratio": f"{precise.hit_ratio:.3f}",
        "precise_vs_least_loaded_ttft_ratio": f"{precise.ttft_ms() / least.ttft_ms():.3f}",
        "least_loaded_prefill_utilisation_4_prefills": f"{wider_least.utilisation:.3f}",
        "least_loaded_hit_ratio_4_prefills": f"{wider_least.hit_ratio:.3f}",
        "approximate_hit_ratio_4_prefills": f"{wider_approximate.hit_ratio:.3f}",
        "precise_hit_ratio_4_prefills": f"{wider_precise.hit_ratio:.3f}",
        "approximate_vs_least_loaded_ttft_ratio_4_prefills":
            f"{wider_approximate.ttft_ms() / wider_least.ttft_ms():.3f}",
        "precise_vs_least_loaded_ttft_ratio_4_prefills":
            f"{wider_precise.ttft_ms() / wider_least.ttft_ms():.3f}",
        "routing_failed_requests": sum(o.failed for o in (least, approximate, two_proxies, precise, oracle,
                                                          wider_least, wider_approximate, wider_precise))
        + len(live.failed),
    })
    return bench.exit_code(live.failed)


if __name__ == "__main__":
    sys.exit(main())

"""Routing by cached prefix on a Mooncake-format trace: TTFT and prefix hits of pd-proxy's prefill choice.

Replays the trace (default: the conversation trace of Mooncake's FAST'25 release, `../shared/traces/`
beside the project; `--trace PATH` for any file of that format) against 2 prefill and 2 decode
instances of the caching fake (tests/support/caching_engine.py: the GLM example's 640-token prefill
blocks, an LRU prefix cache of `--cache-blocks` blocks, prefill and KV-hop times from published
measurements). Each `hash_ids` entry is a fixed 512-token block of synthetic token ids, so two
requests share a token prefix exactly as far as their ids agree; the engine hits on whole 640-token
blocks of it.

It is a time-compressed discrete-event simulation, not a wall-clock replay: the modelled seconds
pass on a virtual clock, and every routing decision is made by pd-proxy's own code of this build
(`least_loaded`: pd_operator.proxy.balancer.Balancer on that clock, as pd-proxy runs it: fewest
requests in flight, prefill's counted from its call to its answer). Each prefill instance serves one
request at a time in arrival order; TTFT is the wait, the prefill of the uncached tokens, and the
KV hop of the whole prompt to decode. All policies run at one time scale (the factor on the trace's
arrival times), found so that least-loaded's prefill utilisation is 0.75 +- 0.01.
`oracle` knows every engine's cache exactly and sends each request where it would finish prefill
first (the work queued there plus its uncached prefill): the hit ratio a perfect index reaches.

Figures:
- requests: requests replayed
- time_scale: the factor on the trace's arrival times
- least_loaded_prefill_utilisation: prefill busy time over instance time while requests arrive,
  least-loaded routing
- least_loaded_ttft_mean_ms: mean TTFT, least-loaded routing
- least_loaded_ttft_p99_ms: its 99th percentile
- least_loaded_hit_ratio: prompt tokens found cached over prompt tokens, least-loaded routing
- oracle_ttft_mean_ms: mean TTFT routed by exact knowledge of every cache
- oracle_ttft_p99_ms: its 99th percentile
- oracle_hit_ratio: prompt tokens found cached over prompt tokens, routed by exact knowledge
- oracle_vs_least_loaded_ttft_ratio: oracle_ttft_mean_ms over least_loaded_ttft_mean_ms
- routing_failed_requests: requests no instance was chosen for
"""

from __future__ import annotations

import gzip
import heapq
import json
import math
import statistics
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import _paths  # noqa: F401  (tests/ on sys.path)

from pd_operator.proxy.balancer import Balancer
from pd_operator.proxy.membership import Upstream, document, parse_document
from support import bench
from support.caching_engine import Costs, PrefixCache, block_hashes, example_kv, measured
from support.specs import ROOT

TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl.gz"
"""The project's shared traces sit beside its checkout (../shared/traces/README.md)."""
TRACE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` entry (the trace's README)."""
PREFILLS, DECODES = 2, 2
CACHE_BLOCKS = 65536
"""Blocks each prefill's prefix cache holds (of the engine's block size): 42M tokens of 640."""
DECODE_TOKEN_S = 0.06949
"""Decode's time per output token (the same measurement as the prefill's fixed part, its TPOT)."""
UTILISATION, TOLERANCE = 0.75, 0.01
"""Least-loaded's prefill utilisation the time scale is chosen for, and how close it gets."""
QUICK = {"requests": 400}


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hashes: list[int]
    """The engine's block hashes of the prompt."""


def read_trace(path: Path, limit: int | None, block_size: int) -> list[Request]:
    """The trace's requests (at most `limit`), prompts built from their hash_ids."""
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as lines:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            tokens = array("q")
            for block_id in row["hash_ids"]:
                tokens.extend(range(block_id * TRACE_BLOCK_TOKENS, (block_id + 1) * TRACE_BLOCK_TOKENS))
            del tokens[row["input_length"]:]
            out.append(Request(row["timestamp"] / 1000, row["input_length"], row["output_length"],
                               block_hashes(tokens, block_size)))
            if limit is not None and len(out) >= limit:
                break
    return out


@dataclass
class Prefill:
    upstream: Upstream
    cache: PrefixCache
    queue: list[tuple[int, Callable[[], None]]] = field(default_factory=list)
    running: bool = False
    busy_s: float = 0.0
    work_s: float = 0.0
    """Modelled seconds of prefill queued or running here."""


class Policy:
    """Chooses a prefill for a request; told when a request is queued and when it finishes."""

    def choose(self, request: Request, prefills: dict[str, Prefill], now: float) -> Upstream | None:
        raise NotImplementedError


class LeastLoaded(Policy):
    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer

    def choose(self, request: Request, prefills: dict[str, Prefill], now: float) -> Upstream | None:
        return self.balancer.pick("prefill", set())


class Oracle(Policy):
    def __init__(self, costs: Costs) -> None:
        self.costs = costs

    def choose(self, request: Request, prefills: dict[str, Prefill], now: float) -> Upstream | None:
        def finish(p: Prefill) -> float:
            cached = p.cache.hit_blocks(request.hashes) * p.cache.block_size
            return p.work_s + self.costs.prefill_s(request.prompt_tokens - cached)
        return min(prefills.values(), key=finish).upstream if prefills else None


@dataclass
class Outcome:
    ttft_s: list[float]
    cached_tokens: int
    prompt_tokens: int
    busy_s: float
    window_s: float
    """From the first arrival to the last."""
    failed: int

    @property
    def utilisation(self) -> float:
        """Prefill work over the instances' time while requests arrive (above 1: it cannot keep up)."""
        return self.busy_s / (PREFILLS * self.window_s)

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens

    def ttft_ms(self, q: int | None = None) -> float:
        if q is None:
            return 1000 * statistics.fmean(self.ttft_s)
        ordered = sorted(self.ttft_s)
        return 1000 * ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]


def simulate(requests: Sequence[Request], scale: float, make_policy: Callable[[Balancer], Policy],
             costs: Costs, cache_blocks: int, block_size: int) -> Outcome:
    """Replay `requests` with arrivals at `scale` times the trace's; what it took."""
    clock = [0.0]
    balancer = Balancer(clock=lambda: clock[0])
    upstreams = {role: [Upstream(f"{role}-{i}", f"http://{role}-{i}:8000") for i in range(n)]
                 for role, n in (("prefill", PREFILLS), ("decode", DECODES))}
    balancer.update(parse_document(document(upstreams["prefill"], upstreams["decode"])))
    policy = make_policy(balancer)
    prefills = {u.name: Prefill(u, PrefixCache(block_size, cache_blocks)) for u in upstreams["prefill"]}
    events: list[tuple[float, int, Callable[[], None]]] = []
    order = iter(range(10**12))
    ttft: list[float] = []
    cached_total = prompt_total = failed = 0

    def at(t: float, action: Callable[[], None]) -> None:
        heapq.heappush(events, (t, next(order), action))

    def start(p: Prefill) -> None:
        nonlocal cached_total, prompt_total
        p.running = bool(p.queue)
        if not p.running:
            return
        index, finish = p.queue.pop(0)
        request = requests[index]
        cached = p.cache.admit(request.hashes).hit_blocks * block_size
        cached_total += cached
        prompt_total += request.prompt_tokens
        took = costs.prefill_s(request.prompt_tokens - cached)
        p.busy_s += took
        at(clock[0] + took, finish)

    def arrive(index: int) -> None:
        nonlocal failed
        request = requests[index]
        upstream = policy.choose(request, prefills, clock[0])
        if upstream is None:
            failed += 1
            return
        p = prefills[upstream.name]
        serving = balancer.serving(upstream, "prefill")
        serving.__enter__()
        estimate = costs.prefill_s(request.prompt_tokens - p.cache.hit_blocks(request.hashes) * block_size)
        p.work_s += estimate

        def finish() -> None:
            nonlocal failed
            p.work_s -= estimate
            serving.__exit__(None, None, None)
            decode = balancer.pick("decode", set())
            if decode is None:
                failed += 1
            else:
                decoding = balancer.serving(decode, "decode")
                decoding.__enter__()
                hop = costs.kv_hop_s(request.prompt_tokens)
                ttft.append(clock[0] + hop - request.arrival_s * scale)
                at(clock[0] + hop + request.output_tokens * DECODE_TOKEN_S,
                   lambda: decoding.__exit__(None, None, None))
            start(p)

        p.queue.append((index, finish))
        if not p.running:
            start(p)

    for i, request in enumerate(requests):
        at(request.arrival_s * scale, lambda i=i: arrive(i))
    window = (requests[-1].arrival_s - requests[0].arrival_s) * scale if requests else 0.0
    while events:
        clock[0], _, action = heapq.heappop(events)
        action()
    busy = sum(p.busy_s for p in prefills.values())
    return Outcome(ttft, cached_total, max(prompt_total, 1), busy, max(window, 1e-9), failed)


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
    parser.add_argument("--cache-blocks", type=int, default=CACHE_BLOCKS,
                        help=f"each prefill's prefix cache, in engine blocks (default {CACHE_BLOCKS})")
    args = bench.parse(parser, argv, QUICK)
    if not args.trace.is_file():
        print(f"error: no trace at {args.trace}: the conversation trace is read from ../shared/traces/ "
              f"beside the project (its README says where it comes from); give another with --trace",
              file=sys.stderr)
        return 2
    kv, costs = example_kv(), measured()
    requests = read_trace(args.trace, args.requests, kv.block_size)
    if not requests:
        print(f"error: {args.trace} holds no requests", file=sys.stderr)
        return 2

    def run(make_policy: Callable[[Balancer], Policy]) -> Callable[[float], Outcome]:
        return lambda scale: simulate(requests, scale, make_policy, costs, args.cache_blocks, kv.block_size)

    scale, least = scale_for_utilisation(run(LeastLoaded), 1e-3, 1e3)
    oracle = run(lambda _: Oracle(costs))(scale)
    bench.report(__doc__, {
        "requests": len(requests),
        "time_scale": f"{scale:.3f}",
        "least_loaded_prefill_utilisation": f"{least.utilisation:.3f}",
        "least_loaded_ttft_mean_ms": f"{least.ttft_ms():.1f}",
        "least_loaded_ttft_p99_ms": f"{least.ttft_ms(99):.1f}",
        "least_loaded_hit_ratio": f"{least.hit_ratio:.3f}",
        "oracle_ttft_mean_ms": f"{oracle.ttft_ms():.1f}",
        "oracle_ttft_p99_ms": f"{oracle.ttft_ms(99):.1f}",
        "oracle_hit_ratio": f"{oracle.hit_ratio:.3f}",
        "oracle_vs_least_loaded_ttft_ratio": f"{oracle.ttft_ms() / least.ttft_ms():.3f}",
        "routing_failed_requests": least.failed + oracle.failed,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Move one GLM-5.3-Flash request (32k-token prompt) from a TP8 prefill to a TP4 decode engine over
loopback through the real Mooncake engine (tcp), one process per rank, and compare:

- merged: the plan's runs (cut at both sides' block boundaries, merged where contiguous), batched
  across layers within the per-peer queue budget, several concurrent batches per peer;
- naive: the per-gcd-segment plan the seed connector starts from (no merging), one stream per peer;
- ceiling: every decode rank reads the same byte count as one contiguous transfer.

Each figure is the median of --repeats pulls, taken in turns; throughput is bytes of the whole
request over the time from the first rank's start to the last rank's end.
Usage: bench/transfer.py [--prompt-tokens N] [--lanes N] [--queue-limit N] [--repeats N] [--quick]

Figures:
- request_bytes: the KV bytes of the request
- merged_entries: runs in the merged plan
- naive_entries: runs in the naive plan
- lanes_per_peer: MC_TCP_LANES_PER_PEER of every rank
- queue_limit: MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER of every rank
- merged_gbps_streams_1: merged, 1 concurrent batch per peer, GB/s
- merged_gbps_streams_2: merged, 2 concurrent batches per peer, GB/s
- merged_gbps_streams_4: merged, 4 concurrent batches per peer, GB/s
- merged_gbps: the best of the three
- naive_gbps: naive, GB/s
- ceiling_gbps: one contiguous transfer per decode rank, GB/s
- merged_vs_ceiling: merged_gbps over ceiling_gbps
- merged_vs_naive: merged_gbps over naive_gbps
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

import _paths  # noqa: F401  (tests/ on sys.path)

from pd_operator.kv import presets
from pd_operator.kv.blocksize import SideLayout, side_layout
from pd_operator.kv.side import Side
from pd_operator.kv.transfer_plan import TransferPlan, plan_transfer
from pd_operator.transfer.engine_requests import arena_bytes, requests
from pd_operator.transfer.executor import DEFAULT_QUEUE_LIMIT, PullOptions
from support import bench
from support.ranks import Pairing, RankWorker, span, start_workers

STREAMS = (1, 2, 4)
QUICK = {"prompt_tokens": 2048, "repeats": 1}


def gbps(reports: list[dict]) -> float:
    nbytes, seconds = span(reports)
    return nbytes / seconds / 1e9


def round_robin(runs: dict[str, Callable[[], list[dict]]], repeats: int) -> dict[str, float]:
    """Median GB/s of each run, taking turns so that load from elsewhere hits all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(gbps(run()))
    return {name: statistics.median(values) for name, values in samples.items()}


def pull_plan(pairing: Pairing, plan: TransferPlan, options: PullOptions) -> Callable[[], list[dict]]:
    def run() -> list[dict]:
        (reports,) = pairing.pull([plan], options)
        failed = [f["message"] for r in reports for f in r["failures"]]
        if failed or not all(r["ok"] for r in reports):
            sys.exit(f"pull failed: {failed[:3]}")
        return reports
    return run


def touch(pairing: Pairing, plan: TransferPlan) -> None:
    for w in pairing.prefill:
        w.send("touch_plan", plan, False, 0x5A)
    for w in pairing.decode[0]:
        w.send("touch_plan", plan, True, 0)
    for w in (*pairing.prefill, *pairing.decode[0]):
        w.result()


def ceiling(pairing: Pairing, plan: TransferPlan) -> Callable[[], list[dict]]:
    """Decode rank r reads its share of the plan's bytes as one run from prefill rank r."""
    shares = {row["rank"]: row["bytes"] for row in plan.per_decode_rank()}
    for rank, w in enumerate(pairing.decode[0]):
        w.send("touch_span", shares[rank], 0)
        pairing.prefill[rank].send("touch_span", shares[rank], 0x5A)
    for rank, w in enumerate(pairing.decode[0]):
        w.result()
        pairing.prefill[rank].result()

    def run() -> list[dict]:
        for rank, w in enumerate(pairing.decode[0]):
            w.send("read_span", pairing.prefill[rank].segment, pairing.prefill[rank].base, shares[rank])
        reports = [w.result() for w in pairing.decode[0]]
        if any(r["rc"] != 0 for r in reports):
            sys.exit(f"contiguous read failed: {[r['rc'] for r in reports]}")
        return reports
    return run


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench.parser(__doc__)
    parser.add_argument("--prompt-tokens", type=int, default=32768)
    parser.add_argument("--lanes", type=int, default=8, help="MC_TCP_LANES_PER_PEER of every rank")
    parser.add_argument("--queue-limit", type=int, default=DEFAULT_QUEUE_LIMIT,
                        help="MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER of every rank")
    parser.add_argument("--repeats", type=int, default=3)
    args = bench.parse(parser, argv, QUICK)

    model = presets.get("glm-5.3-flash")
    p: SideLayout = side_layout(Side("prefill", model, 8))
    d: SideLayout = side_layout(Side("decode", model, 4))
    (req,) = requests(p, d, args.prompt_tokens, 1)
    merged = req.plan
    naive = plan_transfer(p, d, args.prompt_tokens, prefill_blocks=req.prefill.blocks,
                          decode_blocks=req.decode.blocks, prefill_slot=req.prefill.slot,
                          decode_slot=req.decode.slot, merge=False)
    env = {"MC_TCP_LANES_PER_PEER": str(args.lanes),
           "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": str(args.queue_limit)}
    workers: list[RankWorker] = start_workers(12, arena_bytes(p, d, args.prompt_tokens, 1), env)
    try:
        pairing = Pairing.place(workers, p, d, args.prompt_tokens)
        touch(pairing, merged)
        one_stream = PullOptions(queue_limit=args.queue_limit)
        runs = {"ceiling": ceiling(pairing, merged), "naive": pull_plan(pairing, naive, one_stream)}
        runs |= {f"streams_{s}": pull_plan(pairing, merged, replace(one_stream, streams_per_peer=s))
                 for s in STREAMS}
        figures = round_robin(runs, args.repeats)
    finally:
        for w in workers:
            w.close()
    by_streams = {s: figures[f"streams_{s}"] for s in STREAMS}
    best = max(by_streams, key=lambda s: by_streams[s])
    top, naive_gbps = figures["ceiling"], figures["naive"]
    bench.report(__doc__, {
        "request_bytes": merged.bytes, "merged_entries": merged.entries, "naive_entries": naive.entries,
        "lanes_per_peer": args.lanes, "queue_limit": args.queue_limit,
        **{f"merged_gbps_streams_{s}": f"{value:.3f}" for s, value in by_streams.items()},
        "merged_gbps": f"{by_streams[best]:.3f}", "naive_gbps": f"{naive_gbps:.3f}",
        "ceiling_gbps": f"{top:.3f}",
        "merged_vs_ceiling": f"{by_streams[best] / top:.3f}",
        "merged_vs_naive": f"{by_streams[best] / naive_gbps:.3f}",
    })


if __name__ == "__main__":
    main()

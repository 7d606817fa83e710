"""Planning cost of the cross-TP transfer for a long prompt: GLM-5.3-Flash, prefill TP8 -> decode DP2 x TP4.

The baseline is the naive per-segment plan (one run per gcd-sized token segment, no merging, as the
seed connector cuts before coalescing), timed in the same run. Times are medians of --repeats.

Figures:
- prompt_tokens: the request's prompt length
- engine_block_prefill_tokens: the prefill engine's KV block size
- engine_block_decode_tokens: the decode engine's KV block size
- plan_ms_median: planning the merged transfer
- naive_plan_ms_median: planning the naive per-segment transfer
- plan_vs_naive_time_ratio: the first over the second
- check_pair_with_plan_ms_median: the pair's compatibility check, plan included
- plan_target_ms: what planning may take
- plan_within_target: 1 when plan_ms_median is under it, else 0
- merged_entries: runs in the merged plan
- naive_entries: runs in the naive plan
- naive_to_merged_entries_ratio: the second over the first
- transfer_bytes_per_decode_instance: bytes one decode instance pulls
- mean_run_bytes_merged: bytes per run, merged
- mean_run_bytes_naive: bytes per run, naive
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence

import _paths  # noqa: F401  (tests/ on sys.path)

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.compat import check_pair
from pd_operator.kv.side import Side
from pd_operator.kv.transfer_plan import TransferPlan, plan_transfer
from support import bench

PROMPT_TOKENS = 131_072
REPEATS = 15
TARGET_MS = 50.0
QUICK = {"prompt_tokens": 8192, "repeats": 1}


def median_ms(action: Callable[[], object], repeats: int) -> float:
    action()  # warm up (imports, numpy dispatch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench.parser(__doc__)
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = bench.parse(parser, argv, QUICK)
    tokens, repeats = args.prompt_tokens, args.repeats
    glm = presets.get("glm-5.3-flash")
    prefill, decode = Side("prefill", glm, 8), Side("decode", glm, 4, 2)
    p_layout, d_layout = side_layout(prefill), side_layout(decode)

    def merged() -> TransferPlan:
        return plan_transfer(p_layout, d_layout, tokens)

    def naive() -> TransferPlan:
        return plan_transfer(p_layout, d_layout, tokens, merge=False)

    merged_ms, naive_ms = median_ms(merged, repeats), median_ms(naive, repeats)
    check_ms = median_ms(lambda: check_pair(prefill, decode, prompt_tokens=tokens), repeats)
    merged_plan, naive_plan = merged(), naive()
    if merged_plan.bytes != naive_plan.bytes:
        print("error: merged and naive plans move different byte counts", file=sys.stderr)
        return 1
    bench.report(__doc__, {
        "prompt_tokens": tokens,
        "engine_block_prefill_tokens": p_layout.engine_block_size,
        "engine_block_decode_tokens": d_layout.engine_block_size,
        "plan_ms_median": f"{merged_ms:.2f}",
        "naive_plan_ms_median": f"{naive_ms:.2f}",
        "plan_vs_naive_time_ratio": f"{merged_ms / naive_ms:.2f}",
        "check_pair_with_plan_ms_median": f"{check_ms:.2f}",
        "plan_target_ms": f"{TARGET_MS:.0f}",
        "plan_within_target": int(merged_ms < TARGET_MS),
        "merged_entries": merged_plan.entries,
        "naive_entries": naive_plan.entries,
        "naive_to_merged_entries_ratio": f"{naive_plan.entries / merged_plan.entries:.2f}",
        "transfer_bytes_per_decode_instance": merged_plan.bytes,
        "mean_run_bytes_merged": f"{merged_plan.bytes / merged_plan.entries:.0f}",
        "mean_run_bytes_naive": f"{naive_plan.bytes / naive_plan.entries:.0f}",
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())

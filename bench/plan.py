"""Planning cost of the cross-TP transfer for a long prompt: GLM-5.3-Flash, prefill TP8 -> decode DP2 x TP4.

Prints one `name: value` line per figure. The baseline is the naive per-segment plan (one run per
gcd-sized token segment, no merging, as the seed connector cuts before coalescing), timed in the same run.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.compat import check_pair
from pd_operator.kv.side import Side
from pd_operator.kv.transfer_plan import TransferPlan, plan_transfer

PROMPT_TOKENS = 131_072
REPEATS = 15
TARGET_MS = 50.0


def median_ms(action: Callable[[], object]) -> float:
    action()  # warm up (imports, numpy dispatch)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    glm = presets.get("glm-5.3-flash")
    prefill, decode = Side("prefill", glm, 8), Side("decode", glm, 4, 2)
    p_layout, d_layout = side_layout(prefill), side_layout(decode)

    def merged() -> TransferPlan:
        return plan_transfer(p_layout, d_layout, PROMPT_TOKENS)

    def naive() -> TransferPlan:
        return plan_transfer(p_layout, d_layout, PROMPT_TOKENS, merge=False)

    merged_ms, naive_ms = median_ms(merged), median_ms(naive)
    check_ms = median_ms(lambda: check_pair(prefill, decode, prompt_tokens=PROMPT_TOKENS))
    merged_plan, naive_plan = merged(), naive()
    if merged_plan.bytes != naive_plan.bytes:
        print("error: merged and naive plans move different byte counts", file=sys.stderr)
        return 1
    figures = {
        "prompt_tokens": PROMPT_TOKENS,
        "engine_block_prefill_tokens": p_layout.engine_block_size,
        "engine_block_decode_tokens": d_layout.engine_block_size,
        "plan_ms_median": f"{merged_ms:.2f}",
        "naive_plan_ms_median": f"{naive_ms:.2f}",
        "plan_vs_naive_time_ratio": f"{merged_ms / naive_ms:.2f}",
        "check_pair_with_plan_ms_median": f"{check_ms:.2f}",
        "plan_target_ms": f"{TARGET_MS:.0f}",
        "plan_within_target": "yes" if merged_ms < TARGET_MS else "no",
        "merged_entries": merged_plan.entries,
        "naive_entries": naive_plan.entries,
        "naive_to_merged_entries_ratio": f"{naive_plan.entries / merged_plan.entries:.2f}",
        "transfer_bytes_per_decode_instance": merged_plan.bytes,
        "mean_run_bytes_merged": f"{merged_plan.bytes / merged_plan.entries:.0f}",
        "mean_run_bytes_naive": f"{naive_plan.bytes / naive_plan.entries:.0f}",
    }
    for name, value in figures.items():
        print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

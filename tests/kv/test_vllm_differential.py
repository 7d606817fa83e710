"""Differential test: `pdctl`'s verdict on random hybrid shapes against vLLM 0.34's own start-up code.

A seeded generator draws hybrid models (Qwen3-Next: dense attention + Gated DeltaNet; Kimi Linear: MLA + KDA)
with random head counts and dims, conv kernels, model and KV cache dtypes, TP, kernel blocks, requested
blocks and speculative tokens. Each shape is one side on plain vLLM (`platform="vllm"`): vLLM's verdict
comes from `support/vllm_venv/block_alignment.py` (VllmConfig and its checks,
`Platform.update_block_size_for_backend`), ours from `check_pair` on the same config.json. The contract:

- whatever pdctl approves, vLLM accepts, with the same engine block;
- whatever vLLM refuses, pdctl refuses;
- pdctl may refuse more only with a rule for a failure that comes after vLLM's config code (`later`): the
  worker's kernel-block split, a pooled indexer entry cut by a block, and state heads that do not divide
  over TP (vLLM's state-shape code splits conv channels, so its config passes; its layers then split heads
  with integer division, `num_k_heads // tp_size` in qwen_gdn_linear_attn.py, and the connector moves
  whole heads).

All cases run in one probe process; the counts are printed (`pytest -s` shows them).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pd_operator.kv.compat import check_pair
from pd_operator.kv.hf_config import model_from_hf_config
from pd_operator.kv.side import Side
from support.vllm_tier import hf_config, run_probe

pytestmark = pytest.mark.vllm

SEED = 20261203
SHAPES = 320
# Refusals of ours for failures after vLLM's config code (see the module docstring).
LATER_CODES = frozenset({"BlockSizeNotKernelAligned", "BlockNotDivisibleByCompressRatio"})


def later(code: str, group: str, state_groups: set[str]) -> bool:
    return code in LATER_CODES or (code == "HeadsNotDivisibleByTP" and group in state_groups)


def qwen3_next(rng: random.Random) -> dict:
    heads = rng.choice([4, 8, 16, 32])
    key_heads = rng.choice([4, 8, 16])
    head_dim = rng.choice([64, 128])
    return {**hf_config("qwen3-next-80b-a3b-instruct"), "num_hidden_layers": 8, "full_attention_interval": 4,
            "num_attention_heads": heads,
            "num_key_value_heads": rng.choice([h for h in (1, 2, 4, 8) if h <= heads]),
            "head_dim": rng.choice([64, 128, 256]), "linear_num_key_heads": key_heads,
            "linear_num_value_heads": key_heads * rng.choice([1, 2]), "linear_key_head_dim": head_dim,
            "linear_value_head_dim": head_dim, "linear_conv_kernel_dim": rng.choice([2, 3, 4])}


def kimi_linear(rng: random.Random) -> dict:
    base = hf_config("kimi-linear-48b-a3b-instruct")
    return {**base, "num_hidden_layers": 8, "first_k_dense_replace": 1,
            "num_attention_heads": rng.choice([16, 32, 64]), "kv_lora_rank": rng.choice([128, 256, 512]),
            "qk_rope_head_dim": rng.choice([0, 64]),
            "linear_attn_config": {**base["linear_attn_config"], "kda_layers": [1, 2, 3, 5, 6, 7],
                                   "full_attn_layers": [4, 8], "num_heads": rng.choice([8, 16, 32, 64]),
                                   "head_dim": rng.choice([64, 128]),
                                   "short_conv_kernel_size": rng.choice([2, 3, 4])}}


def shapes(seed: int = SEED, count: int = SHAPES) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        config = rng.choice([qwen3_next, kimi_linear])(rng)
        dtype = rng.choices(["bfloat16", "float16", "float32"], [6, 3, 1])[0]
        config = {**config, "dtype": dtype, "torch_dtype": dtype}
        out.append({
            "id": f"shape-{index}", "config": config, "dtype": dtype, "platform": "vllm",
            "tp": rng.choice([1, 2, 4, 8, 16]), "kernel": rng.choice([16, 32, 64, 128]),
            "blockSize": rng.choice([None, None, None, 16, 32, 64, 96, 128, 256, 512, 1024]),
            "kvCacheDtype": rng.choices(["auto", "bfloat16", "float16", "fp8", "fp8_e5m2", "int8"],
                                        [4, 1, 1, 1, 1, 1])[0],
            "specTokens": rng.choice([0, 0, 0, 1, 2, 3]),
        })
    return out


def our_verdict(c: dict) -> tuple[int | None, list[str], bool]:
    """(engine block, error codes, all of them later failures) of `check_pair` on the case as both roles."""
    model = model_from_hf_config(c["config"], "m")
    sides = [Side(role, model, c["tp"], kv_cache_dtype=c["kvCacheDtype"], block_size=c["blockSize"],
                  kernel_block_size=c["kernel"], num_speculative_tokens=c["specTokens"], platform="vllm")
             for role in ("prefill", "decode")]
    report = check_pair(*sides, prompt_tokens=64)
    block = report.prefill_layout.engine_block_size if report.prefill_layout else None
    errors = [f for f in report.findings if f.severity == "error"]
    states = {g.name for g in model.groups if g.kind == "state"}
    return block, sorted({f.code for f in errors}), all(later(f.code, f.group, states) for f in errors)


def classify(c: dict, row: dict) -> tuple[str, str]:
    block, errors, all_later = our_verdict(c)
    if "refused" in row:
        return ("both refuse", "") if errors else ("vLLM refuses, pdctl approves", row["refused"])
    if not errors:
        same = block == row["block"]
        return ("both approve, same block", "") if same else (
            "both approve, blocks differ", f"pdctl {block}, vLLM {row['block']}")
    if all_later:
        return "pdctl refuses a later failure", ",".join(errors)
    return "pdctl refuses, vLLM accepts", ",".join(errors)


AGREEING = {"both refuse", "both approve, same block", "pdctl refuses a later failure"}


def test_pdctl_and_vllm_agree_on_random_hybrid_shapes():
    cases = shapes()
    probed = run_probe(cases)
    outcomes = {c["id"]: classify(c, probed[c["id"]]) for c in cases}
    counts = Counter(kind for kind, _ in outcomes.values())
    print(f"\ndifferential over {len(cases)} seeded shapes (seed {SEED}):")
    for kind, count in sorted(counts.items()):
        print(f"  {kind}: {count}")
    disagreements = {cid: detail for cid, detail in outcomes.items() if detail[0] not in AGREEING}
    print(f"  disagreements: {len(disagreements)}")
    assert not disagreements, "\n".join(f"{cid}: {kind}: {why}" for cid, (kind, why)
                                        in list(disagreements.items())[:20])
    # The generator reaches every outcome the contract talks about, so the test can tell them apart.
    assert counts["both approve, same block"] >= 100 and counts["both refuse"] >= 30

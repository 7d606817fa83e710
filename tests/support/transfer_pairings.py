"""The pairings of the transfer tier: small copies of real presets (few layers) at real TP sizes, and a
Qwen3-Next read from a config.json whose linear-attention key and value head dims differ."""

from __future__ import annotations

import json
from pathlib import Path

from pd_operator.kv import presets
from pd_operator.kv.blocksize import SideLayout, side_layout
from pd_operator.kv.hf_config import model_from_hf_config
from pd_operator.kv.model import ModelKV
from pd_operator.kv.side import Side
from pd_operator.transfer.engine_requests import arena_bytes

# Prompts of one token, mid-block on both sides, a whole number of TP4 GLM blocks, and a long tail.
PROMPTS = (1, 700, 2304, 2999)
# Enough processes for the largest pairing: P TP8 -> D DP2 x TP4.
POOL_SIZE = 16


def few_layers(name: str, layers: int = 2) -> ModelKV:
    """A preset with every group cut to `layers` layers: block sizes do not depend on layer counts."""
    model = presets.get(name)
    return model.model_copy(update={"groups": [g.model_copy(update={"num_layers": layers})
                                               for g in model.groups]})


def pair(model: ModelKV, p_tp: int, d_tp: int, d_dp: int = 1) -> tuple[SideLayout, SideLayout]:
    return side_layout(Side("prefill", model, p_tp)), side_layout(Side("decode", model, d_tp, d_dp))


def qwen3_next_kv_dims_config() -> dict:
    """Qwen3-Next-80B's config.json, 4 layers (one full attention), Gated DeltaNet value heads of 64 against
    key heads of 128: a conv state whose q|k and v parts differ in width, a recurrent state of 64 x 128."""
    path = Path(__file__).parents[1] / "kv" / "hf_configs" / "qwen3-next-80b-a3b-instruct" / "config.json"
    return {**json.loads(path.read_text()), "num_hidden_layers": 4, "linear_value_head_dim": 64}


GLM = few_layers("glm-5.3-flash")
LLAMA = few_layers("llama-3.1-8b")
QWEN_KV_DIMS = model_from_hf_config(qwen3_next_kv_dims_config(), "qwen3-next-kv-dims")
# id -> (prefill layout, decode layout, decode engines)
PAIRINGS = {
    "glm-p8-d4": (*pair(GLM, 8, 4), 1),
    "glm-p8-d2x4": (*pair(GLM, 8, 4, 2), 2),
    "glm-p4-d4": (*pair(GLM, 4, 4), 1),
    "llama-p2-d4": (*pair(LLAMA, 2, 4), 1),
    "qwen3-next-kv-dims-p2-d4": (*pair(QWEN_KV_DIMS, 2, 4), 1),
}


def capacity() -> int:
    return max(arena_bytes(p, d, max(PROMPTS), engines) for p, d, engines in PAIRINGS.values())

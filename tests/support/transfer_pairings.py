"""The pairings of the transfer tier: small copies of real presets (few layers) at real TP sizes."""

from __future__ import annotations

from pd_operator.kv import presets
from pd_operator.kv.blocksize import SideLayout, side_layout
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


GLM = few_layers("glm-5.3-flash")
LLAMA = few_layers("llama-3.1-8b")
# id -> (prefill layout, decode layout, decode engines)
PAIRINGS = {
    "glm-p8-d4": (*pair(GLM, 8, 4), 1),
    "glm-p8-d2x4": (*pair(GLM, 8, 4, 2), 2),
    "glm-p4-d4": (*pair(GLM, 4, 4), 1),
    "llama-p2-d4": (*pair(LLAMA, 2, 4), 1),
}


def capacity() -> int:
    return max(arena_bytes(p, d, max(PROMPTS), engines) for p, d, engines in PAIRINGS.values())

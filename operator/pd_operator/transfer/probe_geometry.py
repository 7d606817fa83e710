"""What the KV-link probe moves: the pairing's real run geometry, from the KV engine.

Both probe sides derive the same geometry from the same pairing (`check_pair` for the verdict,
`plan_transfer` for the runs); the serving side publishes a fingerprint of it so a checker built
for a different pairing fails with the difference instead of misreading bytes. Pure: no engine.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, replace

from pd_operator.kv.blocksize import SideLayout, side_layout
from pd_operator.kv.compat import check_pair
from pd_operator.kv.model import ModelKV
from pd_operator.spec.pairing import PairInput
from pd_operator.transfer.engine_requests import EngineRequest, Pool, pools, requests

# Ends mid-block for the common engine block sizes (128, 640, 1152), so partial blocks are probed.
DEFAULT_PROMPT_TOKENS = 2000
# Layers only repeat the geometry of a group; one per group keeps the probe's memory small.
DEFAULT_LAYERS = 1


class GeometryError(ValueError):
    """The pairing cannot be probed; the message carries the compatibility findings."""


@dataclass(frozen=True)
class ProbeGeometry:
    prefill: SideLayout
    decode: SideLayout
    request: EngineRequest
    prefill_pool: Pool
    decode_pool: Pool

    @property
    def prefill_ranks(self) -> int:
        return self.prefill.side.tensor_parallel * self.prefill.side.pipeline_parallel

    @property
    def decode_ranks(self) -> int:
        return self.decode.side.tensor_parallel

    def fingerprint(self) -> dict:
        """What both sides must agree on, as published by the serving side."""
        plan = self.request.plan
        return {
            "model": self.prefill.side.model.name,
            "prefill": {"tensorParallelSize": self.prefill.side.tensor_parallel,
                        "pipelineParallelSize": self.prefill.side.pipeline_parallel,
                        "engineBlockSize": self.prefill.engine_block_size},
            "decode": {"tensorParallelSize": self.decode.side.tensor_parallel,
                       "engineBlockSize": self.decode.engine_block_size},
            "layers": {g.name: g.num_layers for g in self.prefill.side.model.groups},
            "promptTokens": plan.prompt_tokens,
            "entries": plan.entries,
            "bytes": plan.bytes,
        }


def with_layers(model: ModelKV, layers: int | None) -> ModelKV:
    if layers is None:
        return model
    return model.model_copy(update={"groups": [g.model_copy(update={"num_layers": min(layers, g.num_layers)})
                                               for g in model.groups]})


def probe_geometry(pair: PairInput, prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
                   layers: int | None = DEFAULT_LAYERS) -> ProbeGeometry:
    """Raises GeometryError when the pairing is incompatible (the probe would test nothing real)."""
    report = check_pair(pair.prefill, pair.decode, connector=pair.connector, prompt_tokens=prompt_tokens)
    if not report.compatible:
        raise GeometryError("the pairing is incompatible: "
                            + "; ".join(f.line() for f in report.findings if f.severity == "error"))
    p, d = (side_layout(replace(side, model=with_layers(side.model, layers)))
            for side in (pair.prefill, pair.decode))
    (request,) = requests(p, d, prompt_tokens, 1)
    p_pool, d_pool = pools(p, d, prompt_tokens, 1)
    return ProbeGeometry(p, d, request, p_pool, d_pool)


def _brief_repr() -> reprlib.Repr:
    brief = reprlib.Repr()
    brief.maxlevel, brief.maxstring, brief.maxother, brief.maxlong = 3, 60, 60, 40
    return brief


_BRIEF = _brief_repr()


def peer_value(value: object) -> str:
    """A value a peer sent, shown briefly: it came from the network, of any size and depth."""
    return _BRIEF.repr(value)


def fingerprint_differences(mine: dict, theirs: dict, path: str = "") -> list[str]:
    """Keys on which two fingerprints differ, as `path: ours X, peer Y`."""
    out = []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key), theirs.get(key)
        where = f"{path}.{key}" if path else key
        if isinstance(a, dict) and isinstance(b, dict):
            out += fingerprint_differences(a, b, where)
        elif a != b:
            out.append(f"{where}: this side has {a!r}, the peer {peer_value(b)}")
    return out

"""What the KV-link probe moves: the pairing's real run geometry, from the KV engine.

Both probe sides derive the geometry from their pairing (`check_pair` for the verdict,
`plan_transfer` for the runs). The serving (prefill) side's buffer depends on the prefill side alone
(engine_requests.py: its pool and request blocks come from the prefill layout), so it publishes a
fingerprint of that side and of decode's TP only, and a checker compares just that and the buffer's
regions, then pulls by its own plan: a prefill links a decode of another engine block size
(vllm-ascend PR #16755 moves gcd token-segment runs between them), and a checker built for another
prefill fails with the difference instead of misreading bytes. Pure: no engine.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, replace

from pd_operator.kv.blocksize import SideLayout, side_layout
from pd_operator.kv.compat import check_pair
from pd_operator.kv.model import ModelKV
from pd_operator.kv.simulate import regions
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
        """What the serving side's buffer is built from, as it publishes it: the prefill side, and
        decode's TP, which a MooncakeConnectorV1 prefill engine reads from its own
        kv_connector_extra_config to choose the ranks that wait for a pull (vllm-project/vllm-ascend:
        vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py `_prefill_get_remote_rank`
        @ v0.30.0rc2), so a decode of another TP needs another prefill. Earlier probes also published
        decode's block size and the plan's entries and bytes; a checker compares only these keys
        (fingerprint_differences), so it reads either."""
        return {
            "model": self.prefill.side.model.name,
            "prefill": {"tensorParallelSize": self.prefill.side.tensor_parallel,
                        "pipelineParallelSize": self.prefill.side.pipeline_parallel,
                        "engineBlockSize": self.prefill.engine_block_size},
            "decode": {"tensorParallelSize": self.decode.side.tensor_parallel},
            "layers": {g.name: g.num_layers for g in self.prefill.side.model.groups},
            "promptTokens": self.request.plan.prompt_tokens,
        }

    def prefill_regions(self, rank: int) -> dict[tuple[str, str, int], int]:
        """The bytes of each region a prefill rank publishes (what the fingerprint does not name:
        the cache dtype, the pool, every group's widths)."""
        return {r.key: r.nbytes for r in regions(self.prefill, rank, *self.prefill_pool)}


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
    """Keys of this side's fingerprint on which the peer's differs, as `path: ours X, peer Y`. Keys
    only the peer has are not compared: an earlier serving side's decode and plan (see fingerprint)."""
    out = []
    for key in sorted(mine):
        a, b = mine.get(key), theirs.get(key)
        where = f"{path}.{key}" if path else key
        if isinstance(a, dict) and isinstance(b, dict):
            out += fingerprint_differences(a, b, where)
        elif a != b:
            out.append(f"{where}: this side has {a!r}, the peer {peer_value(b)}")
    return out

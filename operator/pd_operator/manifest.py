"""Reading the prefill/decode pairing out of a PDDeployment manifest, for `pdctl plan FILE`.

This is the minimal reader of the KV-relevant fields; the full API (pd_operator.api) supersedes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pd_operator.findings import Finding
from pd_operator.kv import presets
from pd_operator.kv.hf_config import model_from_hf_config
from pd_operator.kv.model import ModelKV
from pd_operator.kv.side import ASCEND_KERNEL_BLOCK, Side

DEFAULT_CONNECTOR = "MooncakeConnectorV2"


class ManifestError(ValueError):
    """The manifest cannot be read; the message names the field."""


@dataclass(frozen=True)
class PairInput:
    prefill: Side
    decode: Side
    connector: str = DEFAULT_CONNECTOR
    findings: list[Finding] = field(default_factory=list)


def _get(obj: dict, key: str, path: str, kind: type, default=None):
    value = obj.get(key, default)
    if value is None:
        raise ManifestError(f"{path}.{key} is required")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{path}.{key} must be a {kind.__name__}, not {value!r}")
    return value


def model_from_spec(model: dict) -> ModelKV:
    sources = [k for k in ("preset", "hfConfig", "kv") if k in model]
    if len(sources) != 1:
        raise ManifestError("spec.model needs exactly one of preset, hfConfig or kv")
    if "preset" in model:
        try:
            kv = presets.get(_get(model, "preset", "spec.model", str))
        except KeyError as err:
            raise ManifestError(f"spec.model.preset: {err.args[0]}") from None
    elif "hfConfig" in model:
        name = model.get("servedModelName") or "model"
        try:
            kv = model_from_hf_config(model["hfConfig"], name)
        except ValueError as err:
            raise ManifestError(f"spec.model.hfConfig: {err}") from None
    else:
        try:
            kv = ModelKV.model_validate(model["kv"])
        except ValueError as err:
            raise ManifestError(f"spec.model.kv: {err}") from None
    if "dtype" in model:
        kv = kv.model_copy(update={"dtype": _get(model, "dtype", "spec.model", str)})
    return kv


def side_from_role(role: str, spec: dict, model: ModelKV, kv_cache_dtype: str) -> Side:
    path = f"spec.{role}"
    body = _get(spec, role, "spec", dict)
    return Side(
        role=role,  # type: ignore[arg-type]
        model=model,
        tensor_parallel=_get(body, "tensorParallelSize", path, int, 1),
        data_parallel=_get(body, "dataParallelSize", path, int, 1),
        pipeline_parallel=_get(body, "pipelineParallelSize", path, int, 1),
        kv_cache_dtype=kv_cache_dtype,
        block_size=body.get("blockSize"),
        kernel_block_size=_get(body, "kernelBlockSize", path, int, ASCEND_KERNEL_BLOCK),
        num_speculative_tokens=_get(body, "numSpeculativeTokens", path, int, 0),
        path=path,
    )


def pair_from_manifest(doc: object) -> PairInput:
    if not isinstance(doc, dict) or doc.get("kind") != "PDDeployment":
        raise ManifestError("the document is not a PDDeployment (kind: PDDeployment)")
    spec = _get(doc, "spec", "", dict)
    model_spec = _get(spec, "model", "spec", dict)
    model = model_from_spec(model_spec)
    cache = model_spec.get("kvCacheDtype", "auto")
    connector = (spec.get("kvTransfer") or {}).get("connector", DEFAULT_CONNECTOR)
    return PairInput(side_from_role("prefill", spec, model, cache),
                     side_from_role("decode", spec, model, cache), connector)

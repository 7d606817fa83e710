"""The prefill/decode pairing of a PDDeployment: its model's KV description and the two sides as the
KV engine sees them. The validator builds its KV report from it; `pdctl plan FILE` reads a user's
manifest through the validator (spec.validate.pair_from_manifest); the KV-link probe reads the
pairing file the operator rendered (`pair_from_rendered`).

Why the probe does not go through the validator: it runs in serving images, from the tools bundle
(serving_image/bundle.py), and those have pydantic but not the admission-time schema checks'
packages (jsonschema, cel-python). The file it reads was rendered from a spec the validator accepted,
so the API model's own checks (pydantic) are enough to read it back; nothing here imports them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pd_operator.api.types import KVTransferSpec, ModelSpec, PDDeployment, RoleSpec
from pd_operator.api_model import field_path, sentence
from pd_operator.findings import Finding
from pd_operator.kv import presets
from pd_operator.kv.compat import check_pair
from pd_operator.kv.hf_config import ConfigError, model_from_hf_config
from pd_operator.kv.model import ModelKV
from pd_operator.kv.side import Side, prefix_caching_on

DEFAULT_CONNECTOR = KVTransferSpec.model_fields["connector"].default
ConfigMapReader = Callable[[str, str], str | None]
"""(configmap name, key) -> the value, or None when the ConfigMap or key does not exist."""


class ManifestError(ValueError):
    """The manifest cannot be read as a pairing; the message names the fields."""


@dataclass(frozen=True)
class PairInput:
    prefill: Side
    decode: Side
    connector: str = DEFAULT_CONNECTOR
    findings: list[Finding] = field(default_factory=list)
    """Findings about the manifest other than the KV pair's own (ports, names, overrides)."""


def resolve_model(spec: ModelSpec, namespace: str, read_config_map: ConfigMapReader | None
                  ) -> tuple[ModelKV | None, list[Finding]]:
    name = spec.served_model_name or spec.name
    try:
        if spec.preset is not None:
            model = presets.get(spec.preset)
        elif spec.kv is not None:
            model = spec.kv
        elif spec.hf_config is not None:
            model = model_from_hf_config(spec.hf_config, name)
        else:
            ref = spec.hf_config_map
            assert ref is not None
            if read_config_map is None:
                return None, [Finding(
                    "KVCheckDeferred", "warning", "spec.model.hfConfigMap", "",
                    f"The model config is in ConfigMap {ref.name}; the controller reads it and reports "
                    "KV compatibility in the KVCompatible condition.")]
            text = read_config_map(ref.name, ref.key)
            if text is None:
                return None, [Finding("ConfigMapNotFound", "error", "spec.model.hfConfigMap", "",
                                      f"ConfigMap {namespace}/{ref.name} has no key {ref.key!r}; create it "
                                      "with the model's config.json.")]
            try:
                data = json.loads(text)
            except ValueError as err:
                raise ConfigError(f"key {ref.key!r} of ConfigMap {ref.name} is not JSON: {err}") from None
            model = model_from_hf_config(data, name)
    except KeyError as err:
        return None, [Finding("UnknownModel", "error", "spec.model.preset", "", f"{err.args[0]}.")]
    except ConfigError as err:
        where = "spec.model.hfConfigMap" if spec.hf_config_map else "spec.model.hfConfig"
        code = "UnsupportedArchitecture" if "no KV description rule" in str(err) else "UnknownModel"
        return None, [Finding(code, "error", where, "", f"{err}.")]
    if spec.dtype is not None:
        model = model.model_copy(update={"dtype": spec.dtype})
    return model, []


def side_of(role: str, spec: RoleSpec, model: ModelKV, kv_cache_dtype: str) -> Side:
    """The side as a serving image runs it: every image is a vllm-ascend one, so vllm-ascend's block
    rule (platform "ascend", as 0.30.0rc2 has it); images whose release sizes blocks otherwise are
    refused by capabilities.findings (ImageBlockRuleUnmodelled, KVCacheDTypeUnsupported)."""
    return Side(role=role, model=model, tensor_parallel=spec.tensor_parallel_size,  # type: ignore[arg-type]
                data_parallel=spec.data_parallel_size, pipeline_parallel=spec.pipeline_parallel_size,
                kv_cache_dtype=kv_cache_dtype, block_size=spec.block_size,
                kernel_block_size=spec.kernel_block_size,
                num_speculative_tokens=spec.num_speculative_tokens, path=f"spec.{role}",
                model_path="spec.model", platform="ascend",
                prefix_caching=prefix_caching_on(spec.enable_prefix_caching, model))


def pair_from_rendered(doc: Any) -> PairInput:
    """The pairing of a manifest the operator rendered (render/serving_config.py: its model's KV
    description inline), read with the API model alone."""
    try:
        dep = PDDeployment.model_validate(doc)
    except ValidationError as err:
        raise ManifestError("; ".join(f"{field_path(e['loc'])}: {sentence(e['msg'])}"
                                      for e in err.errors())) from None
    model, findings = resolve_model(dep.spec.model, dep.namespace, None)
    if model is None:
        raise ManifestError("; ".join(f"{f.path}: {f.message}" for f in findings))
    cache_dtype = dep.spec.model.kv_cache_dtype
    report = check_pair(side_of("prefill", dep.spec.prefill, model, cache_dtype),
                        side_of("decode", dep.spec.decode, model, cache_dtype),
                        connector=dep.spec.kv_transfer.connector)
    return PairInput(report.prefill, report.decode, dep.spec.kv_transfer.connector)

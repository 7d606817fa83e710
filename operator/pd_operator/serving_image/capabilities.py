"""What a serving image can do, as data, and the findings for a pairing an image cannot serve.

A serving image is a vllm-ascend release (quay.io/ascend/vllm-ascend:v<version>[-a3|-a5|...]) or
an image built from images/vllm-ascend, which adds the seed change (vllm-ascend PR #16755) to a
release. What the operator renders depends on it: MooncakeConnectorV2 exists only from 0.28.0rc1;
GLM-Next has vllm-ascend model code only from 0.28.0rc1 and runs there on Model Runner V1 (the
0.30.0rc2 GLM-5.3-Flash guide sets VLLM_USE_V2_MODEL_RUNNER=0); Model Runner V2 for GLM-Next and
the token-run transfer between unequal kernel blocks (`_compute_cross_tp_runs`) come with the seed.

One record serves three readers: spec/validate.py refuses pairings the image cannot serve, render/env.py
takes the model-runner flag from it, and the pod's preflight (pd_operator.serving_image.installed) compares
the
installed vllm-ascend with the same record. tests/contract checks every row against vllm-ascend's
released source, so the table cannot drift from what a release registers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from pydantic import Field

from pd_operator.api_model import ApiModel
from pd_operator.findings import Finding
from pd_operator.kv.dtypes import canonical_dtype
from pd_operator.kv.model import IndexerGroup, ModelKV
from pd_operator.kv.pages import C8_DTYPES

SEED_PULL_REQUEST = 16755
SEED_FUNCTION = "_compute_cross_tp_runs"
"""The seed's cross-TP token-run function, defined in MooncakeConnectorV2's package."""
CONNECTOR_V1 = "MooncakeConnectorV1"
CONNECTOR_V2 = "MooncakeConnectorV2"
PD_CONNECTORS = (CONNECTOR_V2, CONNECTOR_V1)
"""The kv_connector names spec.kvTransfer.connector offers (and the renderer writes)."""
GLM_NEXT = "glm-next"
"""GLM-Next (GLM-5.3-Flash): NoPE MLA, a compressed sparse indexer and KDA linear attention."""
VERSION_PATTERN = r"^\d+\.\d+\.\d+(rc\d+|\.post\d+)?$"
# quay.io/ascend/vllm-ascend:v0.30.0rc2-a3 (any registry or mirror whose repository is vllm-ascend),
# also pinned by digest (`...:v0.30.0rc2@sha256:<64 hex>`: the runtime pulls the digest, the tag
# still says which release it is).
_RELEASE_TAG = re.compile(
    r"(?:^|/)vllm-ascend:v(\d+\.\d+\.\d+(?:rc\d+|\.post\d+)?)(?:-[a-z0-9.]+)*(?:@sha256:[0-9a-f]{64})?$")


@dataclass(frozen=True)
class Release:
    """One vllm-ascend release the operator knows (its PyPI source archive is in the contract tier)."""

    version: str
    connectors: frozenset[str]
    """PD_CONNECTORS its connector registry registers (vllm_ascend/distributed/kv_transfer/__init__.py)."""
    families: frozenset[str]
    """Model families whose model code it carries (GLM-Next: vllm_ascend/models/glm5next/)."""
    int8_kv_cache: bool
    """Accepts `--kv-cache-dtype int8`: vLLM's CacheDType lacks it and vllm-ascend widens it
    (vllm_ascend/patch/platform/patch_kv_cache_dtype.py, first in 0.29.0rc1)."""
    block_rule_modelled: bool
    """Its hybrid block rule is the one pd_operator.kv plans (vllm_ascend/patch/platform/
    patch_mamba_config.py @ 0.30.0rc2: the pooled-indexer rule with C8 packing, vLLM's rule for other
    hybrid models). Older releases size every other hybrid model by their own state-aligned rule and
    do not pack an int8/fp8 MLA cache."""
    python: tuple[int, int] = (3, 12)
    """The release image's python3: its CANN base is `...-py3.12` since vllm-ascend 0.21.0rc1
    (vllm-ascend PR #9558; Dockerfile @ every release here)."""


# Ordered oldest first. 0.23.0 is the release the stock `v0.23.0-a3` images carry; 0.28.0rc1 first
# registers MooncakeConnectorV2 (vllm-ascend PR #14068) and GLM-Next.
_V1_V2 = frozenset({CONNECTOR_V1, CONNECTOR_V2})
RELEASES: dict[str, Release] = {r.version: r for r in (
    Release("0.23.0", frozenset({CONNECTOR_V1}), frozenset(), int8_kv_cache=False, block_rule_modelled=False),
    Release("0.28.0rc1", _V1_V2, frozenset({GLM_NEXT}), int8_kv_cache=False, block_rule_modelled=False),
    Release("0.29.0rc1", _V1_V2, frozenset({GLM_NEXT}), int8_kv_cache=True, block_rule_modelled=False),
    Release("0.30.0rc2", _V1_V2, frozenset({GLM_NEXT}), int8_kv_cache=True, block_rule_modelled=True),
)}
MODELLED_BLOCK_RULE = next(r.version for r in RELEASES.values() if r.block_rule_modelled)
TRACKED_FAMILIES = frozenset({GLM_NEXT})
"""Families that need vllm-ascend's own model code; other models come with vLLM on every release."""


class ImageCapabilities(ApiModel):
    """What one serving image can do; also the claim the preflight checks the pod's image against."""

    vllm_ascend_version: str = Field(pattern=VERSION_PATTERN)
    seed_change: bool
    """Carries vllm-ascend PR #16755 (Model Runner V2 for GLM-Next, cross-TP token runs)."""
    connectors: tuple[str, ...]
    families: tuple[str, ...]

    def runs_on_model_runner_v2(self, family: str | None) -> bool:
        """Whether `family` runs on Model Runner V2 on this image (VLLM_USE_V2_MODEL_RUNNER=1).

        vllm-ascend selects the runner by VLLM_USE_V2_MODEL_RUNNER alone and defaults to V1
        (vllm_ascend/patch/platform/patch_use_v2_model_runner.py @ 0.30.0rc2); its GLM-5.3-Flash
        guide runs V1. Model Runner V2 is used only where the seed makes it work: GLM-Next on a
        seed image (the PR: "Requires VLLM_USE_V2_MODEL_RUNNER=1"). Other models keep the default.
        """
        return self.seed_change and family == GLM_NEXT


def release_of_tag(image: str) -> str | None:
    """The vllm-ascend release a release image's tag names (`...vllm-ascend:v0.30.0rc2-a3`, with or
    without a digest after it), or None."""
    match = _RELEASE_TAG.search(image)
    return match.group(1) if match else None


def capabilities(image: str, vllm_ascend_version: str | None = None,
                 seed_change: bool | None = None) -> ImageCapabilities | None:
    """The capabilities of an image: the given version (else the tag's) looked up in RELEASES, with
    the seed change when stated. None when the version is unknown or not a known release."""
    version = vllm_ascend_version or release_of_tag(image)
    release = RELEASES.get(version) if version else None
    if release is None:
        return None
    return ImageCapabilities(vllm_ascend_version=release.version, seed_change=bool(seed_change),
                             connectors=tuple(sorted(release.connectors)),
                             families=tuple(sorted(release.families)))


class ImageRef(Protocol):
    """What spec.image says (api.types.ImageSpec; a protocol so this module stays below the API)."""

    @property
    def name(self) -> str: ...
    @property
    def vllm_ascend_version(self) -> str | None: ...
    @property
    def seed_change(self) -> bool: ...


def of_image(image: ImageRef) -> ImageCapabilities | None:
    """The capabilities spec.image describes (None: ImageUnknown). Also what other modules key on,
    e.g. the vllm-ascend release whose block rule applies (`.vllm_ascend_version`), and the claim
    the preflight checks the pod's image against."""
    return capabilities(image.name, image.vllm_ascend_version, image.seed_change)


def family_of(model: ModelKV) -> str | None:
    """The tracked family a KV description belongs to, by the cache layout the runner must handle.

    A compressed sparse indexer (compress_ratio > 1) is what only GLM-Next has and what the seed's
    Model Runner V2 changes are about ("the strided reshape only triggers for MLA-family specs with
    compress_ratio > 1", PR #16755), so it identifies the family whichever way the model was given
    (preset, config.json or explicit kv)."""
    if any(isinstance(g, IndexerGroup) and g.compress_ratio > 1 for g in model.groups):
        return GLM_NEXT
    return None


def model_runner_env(caps: ImageCapabilities, model: ModelKV) -> str:
    """The rendered VLLM_USE_V2_MODEL_RUNNER: "1" for Model Runner V2, "0" for V1."""
    return "1" if caps.runs_on_model_runner_v2(family_of(model)) else "0"


def _known() -> str:
    return ", ".join(RELEASES)


def _block_rule_findings(release: Release, model: ModelKV, kv_cache_dtype: str) -> list[Finding]:
    """A KV cache dtype the release refuses, or a pairing whose engine block the release sizes by a
    rule the operator does not plan (so the block it renders would not be the engine's)."""
    out = []
    version = release.version
    if kv_cache_dtype.lower() == "int8" and not release.int8_kv_cache:
        since = next(r.version for r in RELEASES.values() if r.int8_kv_cache)
        out.append(Finding(
            "KVCacheDTypeUnsupported", "error", "spec.model.kvCacheDtype", "",
            f"vllm-ascend {version} does not accept --kv-cache-dtype int8 (vLLM's CacheDType lacks it; "
            f"vllm-ascend widens it from {since}); use another kvCacheDtype or an image with vllm-ascend "
            f"{since} or later."))
    if release.block_rule_modelled or not model.is_hybrid:
        return out
    pooled = family_of(model) == GLM_NEXT
    if not pooled:
        out.append(Finding(
            "ImageBlockRuleUnmodelled", "error", "spec.image.name", "",
            f"vllm-ascend {version} sizes the engine block of hybrid models by its own state-aligned rule "
            "(vllm_ascend/patch/platform/patch_mamba_config.py), not the one the operator plans, so the "
            f"rendered --block-size may not be the engine's; use an image with vllm-ascend "
            f"{MODELLED_BLOCK_RULE}."))
    elif canonical_dtype(kv_cache_dtype) in C8_DTYPES:
        out.append(Finding(
            "ImageBlockRuleUnmodelled", "error", "spec.model.kvCacheDtype", "",
            f"vllm-ascend {version} does not pack an int8/fp8 MLA cache (C8 packing arrives in "
            f"{MODELLED_BLOCK_RULE}), so its engine block differs from the one the operator plans; use "
            f"kvCacheDtype auto or an image with vllm-ascend {MODELLED_BLOCK_RULE}."))
    return out


def findings(image: ImageRef, connector: str, model: ModelKV | None, kv_cache_dtype: str,
             kernel_blocks: tuple[int, int]) -> list[Finding]:
    """Why this image cannot serve the pairing: an unknown image, a connector it does not register, a
    model family it has no code for, a KV cache dtype it refuses or whose block rule the operator
    does not plan, or unequal kernel blocks without the seed change.

    `kernel_blocks` is (prefill, decode) spec kernelBlockSize: MooncakeConnectorV2 of a release
    pairs blocks at kernel-block granularity and asserts "MooncakeConnector does not support
    different local and remote kernel block size" (kv_p2p/mooncake/pull_worker.py @ 0.30.0rc2)."""
    tagged = release_of_tag(image.name)
    if tagged and image.vllm_ascend_version and tagged != image.vllm_ascend_version:
        return [Finding("ImageVersionConflict", "error", "spec.image.vllmAscendVersion", "",
                        f"{image.name} is the vllm-ascend {tagged} release image, but vllmAscendVersion "
                        f"says {image.vllm_ascend_version}; drop vllmAscendVersion (the tag names the "
                        "release) or name the image you mean.")]
    caps = of_image(image)
    if caps is None:
        version = image.vllm_ascend_version or release_of_tag(image.name)
        path = "spec.image.vllmAscendVersion" if image.vllm_ascend_version else "spec.image.name"
        why = (f"vllm-ascend {version} is not a release the operator knows" if version else
               f"the tag of {image.name} does not name a vllm-ascend release")
        return [Finding("ImageUnknown", "error", path, "",
                        f"The operator cannot tell what this image serves: {why}. Use a release image "
                        f"(quay.io/ascend/vllm-ascend:v<version>) or set spec.image.vllmAscendVersion to "
                        f"the release it is built on ({_known()}) and spec.image.seedChange when it "
                        f"carries vllm-ascend PR #{SEED_PULL_REQUEST}.")]
    out = []
    version = caps.vllm_ascend_version
    if connector not in caps.connectors:
        since = next((r.version for r in RELEASES.values() if connector in r.connectors), None)
        out.append(Finding(
            "ImageLacksConnector", "error", "spec.kvTransfer.connector", "",
            f"vllm-ascend {version} does not register {connector} (first in {since}), so vLLM would "
            f"refuse the kv_connector at start-up; use {', '.join(caps.connectors)} or an image with "
            f"vllm-ascend {since} or later."))
    family = family_of(model) if model is not None else None
    if family in TRACKED_FAMILIES and family not in caps.families:
        since = next((r.version for r in RELEASES.values() if family in r.families), None)
        out.append(Finding(
            "ImageLacksModel", "error", "spec.image.name", "",
            f"vllm-ascend {version} has no model code for {family} (first in {since}); use an image "
            f"with vllm-ascend {since} or later."))
    if model is not None:
        out += _block_rule_findings(RELEASES[version], model, kv_cache_dtype)
    p_kernel, d_kernel = kernel_blocks
    if p_kernel != d_kernel and not caps.seed_change and connector == CONNECTOR_V2:
        out.append(Finding(
            "ImageLacksSeedChange", "error", "spec.image.seedChange", "",
            f"Prefill uses {p_kernel}-token and decode {d_kernel}-token kernel blocks; vllm-ascend "
            f"{version}'s {CONNECTOR_V2} only pairs equal kernel blocks. Moving token runs between "
            f"unequal kernel blocks needs vllm-ascend PR #{SEED_PULL_REQUEST}: use an image built from "
            "images/vllm-ascend (and set spec.image.seedChange: true) or give both roles the same "
            "kernelBlockSize."))
    return out

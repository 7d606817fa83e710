"""The image capability model: which pairings each serving image serves, the findings for those it
cannot, and the model-runner flag rendered from it. (tests/contract checks the table itself against
vllm-ascend's released source.)"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pd_operator.cli import main
from pd_operator.kv import presets
from pd_operator.render import render
from pd_operator.render.runnable import validate
from pd_operator.serving_image import capabilities

ROOT = Path(__file__).resolve().parents[2]
GLM = yaml.safe_load((ROOT / "examples/glm-5.3-flash-tp8-dp2tp4.yaml").read_text())
QWEN = yaml.safe_load((ROOT / "examples/qwen3-next-a2.yaml").read_text())
STOCK_023 = {"name": "quay.io/ascend/vllm-ascend:v0.23.0-a3"}
STOCK_030 = {"name": "quay.io/ascend/vllm-ascend:v0.30.0rc2-a3"}
SEED = {"name": "registry.example.com/pd-operator/pd-vllm-ascend:v0.30.0rc2-seed",
        "vllmAscendVersion": "0.30.0rc2", "seedChange": True}


def on(doc: dict, image: dict, **spec) -> dict:
    out = copy.deepcopy(doc)
    out["spec"]["image"] = image
    for role, fields in spec.items():
        out["spec"][role].update(fields)
    return out


def codes(doc: dict) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in validate(doc).errors]


def runner(doc: dict) -> set[str]:
    validation = validate(doc)
    assert validation.ok, [f.line() for f in validation.errors]
    return {e["value"] for m in render(validation.resolved) if m["kind"] == "StatefulSet"
            for e in m["spec"]["template"]["spec"]["containers"][0]["env"]
            if e["name"] == "VLLM_USE_V2_MODEL_RUNNER"}


@pytest.mark.parametrize("tag, version", [
    ("quay.io/ascend/vllm-ascend:v0.30.0rc2", "0.30.0rc2"),
    ("quay.io/ascend/vllm-ascend:v0.23.0-a3", "0.23.0"),
    ("mirror.local:5000/ascend/vllm-ascend:v0.28.0rc1-a3-openeuler", "0.28.0rc1"),
    ("quay.io/ascend/vllm-ascend:v0.23.0.post1", "0.23.0.post1"),
    # Pinned by digest: the tag still names the release.
    ("quay.io/ascend/vllm-ascend:v0.30.0rc2-a3@sha256:" + "0" * 64, "0.30.0rc2"),
    ("quay.io/ascend/vllm-ascend@sha256:" + "0" * 64, None),   # no tag: vllmAscendVersion says which
    ("quay.io/ascend/vllm-ascend:v0.30.0rc2@sha256:0abc", None),   # not a digest
    ("registry.example.com/pd-vllm-ascend:v0.30.0rc2-seed", None),   # not a release repository
    ("quay.io/ascend/vllm-ascend:latest", None),
    ("quay.io/ascend/vllm-ascend:glm-5.3-flash-a3", None),
])
def test_release_of_tag(tag, version):
    assert capabilities.release_of_tag(tag) == version


def test_a_release_pinned_by_digest_serves_as_its_tag_says_and_runs_by_its_digest():
    """A tag can be pushed again, a digest cannot: `vllm-ascend:v0.30.0rc2-a3@sha256:...` is the
    release its tag names, and every serving container runs exactly that reference."""
    pinned = {"name": STOCK_030["name"] + "@sha256:" + "5" * 64}
    assert codes(on(GLM, pinned)) == codes(on(GLM, STOCK_030)) == []
    images = {c["image"] for m in render(validate(on(GLM, pinned)).resolved) if m["kind"] == "StatefulSet"
              for c in m["spec"]["template"]["spec"]["containers"]}
    assert pinned["name"] in images


def test_glm_on_a_stock_023_image_is_refused_by_pdctl_validate(tmp_path, capsys):
    path = tmp_path / "glm-on-023.yaml"
    path.write_text(yaml.safe_dump(on(GLM, STOCK_023)))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert ("error: ImageLacksConnector at spec.kvTransfer.connector: vllm-ascend 0.23.0 does not register "
            "MooncakeConnectorV2 (first in 0.28.0rc1)") in out
    assert ("error: ImageLacksModel at spec.image.name: vllm-ascend 0.23.0 has no model code for "
            "glm-next") in out


def test_each_release_serves_what_its_table_row_says():
    assert codes(on(GLM, STOCK_030)) == []
    assert codes(on(GLM, SEED)) == []
    glm_v1 = on(GLM, STOCK_023)
    glm_v1["spec"]["kvTransfer"]["connector"] = "MooncakeConnectorV1"
    assert ("ImageLacksConnector", "spec.kvTransfer.connector") not in codes(glm_v1)
    assert ("ImageLacksModel", "spec.image.name") in codes(glm_v1)


def test_unequal_kernel_blocks_need_the_seed_change():
    unequal = {"decode": {"kernelBlockSize": 256}}
    assert codes(on(GLM, STOCK_030, **unequal)) == [("ImageLacksSeedChange", "spec.image.seedChange")]
    assert codes(on(GLM, SEED, **unequal)) == []


def test_an_image_the_tag_cannot_tell_needs_its_release_named():
    custom = {"name": "registry.example.com/team/serving:2026-10"}
    assert codes(on(GLM, custom)) == [("ImageUnknown", "spec.image.name")]
    assert codes(on(GLM, {**custom, "vllmAscendVersion": "0.27.1rc1"})) == \
        [("ImageUnknown", "spec.image.vllmAscendVersion")]
    assert codes(on(GLM, {**custom, "vllmAscendVersion": "0.30.0rc2"})) == []


def test_model_runner_is_rendered_from_the_image_and_the_model():
    assert runner(on(GLM, STOCK_030)) == {"0"}     # the release's GLM-5.3-Flash guide: Model Runner V1
    assert runner(on(GLM, SEED)) == {"1"}          # the seed: GLM-Next PD on Model Runner V2
    assert runner(on(QWEN, SEED)) == {"0"}         # other models keep vllm-ascend's default


def test_glm_next_is_recognised_by_its_compressed_indexer():
    assert capabilities.family_of(presets.get("glm-5.3-flash")) == capabilities.GLM_NEXT
    for other in ("deepseek-v3.2", "qwen3-next-80b-a3b", "llama-3.1-8b"):
        assert capabilities.family_of(presets.get(other)) is None


def with_cache_dtype(doc: dict, dtype: str) -> dict:
    out = copy.deepcopy(doc)
    out["spec"]["model"]["kvCacheDtype"] = dtype
    return out


STOCK_028 = {"name": "quay.io/ascend/vllm-ascend:v0.28.0rc1-a3"}
STOCK_029 = {"name": "quay.io/ascend/vllm-ascend:v0.29.0rc1-a3"}


def test_the_block_rule_and_kv_cache_dtypes_follow_the_image_release():
    # int8 exists from 0.29.0rc1 (patch_kv_cache_dtype.py); C8 packing of an int8/fp8 MLA cache and
    # vLLM's rule for other hybrid models only in 0.30.0rc2, the rule pd_operator.kv plans.
    assert codes(with_cache_dtype(on(GLM, STOCK_028), "int8")) == \
        [("KVCacheDTypeUnsupported", "spec.model.kvCacheDtype"),
         ("ImageBlockRuleUnmodelled", "spec.model.kvCacheDtype")]
    assert codes(with_cache_dtype(on(GLM, STOCK_029), "int8")) == \
        [("ImageBlockRuleUnmodelled", "spec.model.kvCacheDtype")]
    assert codes(on(GLM, STOCK_029)) == []  # bf16: 0.29's pooled-indexer rule is 0.30's
    assert codes(with_cache_dtype(on(GLM, STOCK_030), "int8")) == []
    assert codes(on(QWEN, STOCK_029)) == [("ImageBlockRuleUnmodelled", "spec.image.name")]
    assert codes(on(QWEN, STOCK_030)) == []


@pytest.mark.parametrize("version", ["0.30.0rc2", "0.29.0rc1"])
def test_a_release_tag_contradicting_vllm_ascend_version_is_a_finding(version):
    doc = on(GLM, {**STOCK_023, "vllmAscendVersion": version})
    assert codes(doc) == [("ImageVersionConflict", "spec.image.vllmAscendVersion")]
    message = next(f.message for f in validate(doc).errors)
    assert "vllm-ascend 0.23.0 release image" in message and version in message
    # Agreeing with the tag, or naming an image whose tag names no release, is no conflict.
    assert ("ImageVersionConflict", "spec.image.vllmAscendVersion") not in codes(
        on(GLM, {**STOCK_030, "vllmAscendVersion": "0.30.0rc2"}))
    assert codes(on(GLM, SEED)) == []  # its tag names no release: vllmAscendVersion says which

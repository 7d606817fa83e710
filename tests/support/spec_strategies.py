"""Hypothesis strategies for PDDeployment documents a user (or a broken tool) might send: valid ones
(`deployments()`, which the renderer's property tests use too), valid ones at the bounds of every limit,
and malformed ones (wrong types, negative and huge numbers, unicode names, missing sections, unknown
fields, 1 MB strings, non-mapping documents)."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

from support.specs import ROOT

PRESETS = ("glm-5.3-flash", "deepseek-v3.2", "llama-3.1-8b", "qwen3-next-80b-a3b")
HF_CONFIG = json.loads((ROOT / "tests" / "api" / "llama-3.1-8b.config.json").read_text())
# A preset, or an inline Hugging Face config (which the probes get as a resolved `kv` description).
models = st.sampled_from([{"preset": p} for p in PRESETS] + [{"hfConfig": HF_CONFIG}])


@st.composite
def roles(draw, role: str) -> dict:
    spec = {"replicas": draw(st.integers(0, 3)),
            "tensorParallelSize": draw(st.sampled_from([1, 2, 4, 8])),
            "dataParallelSize": draw(st.sampled_from([1, 2, 4])),
            "npusPerNode": draw(st.sampled_from([8, 16]))}
    if role == "prefill" and draw(st.booleans()):
        spec["pipelineParallelSize"] = 2
    if draw(st.booleans()):
        spec["extraArgs"] = ["--enforce-eager"]
    if draw(st.booleans()):
        spec["env"] = [{"name": "OMP_NUM_THREADS", "value": "4"}, {"name": "MY_VAR", "value": "x"}]
    if draw(st.booleans()):
        spec["hostNetwork"] = True
    if draw(st.booleans()):
        hccn = {"path": "/etc/hccn.conf", "type": "File"}
        spec["hostMounts"] = {"generation": draw(st.sampled_from(["A2", "A3", "A5", "none"])),
                              "paths": draw(st.sampled_from([[], [hccn]]))}
    if draw(st.booleans()):
        spec["resources"] = {"requests": {"cpu": "16", "memory": "200Gi"}, "limits": {"memory": "400Gi"}}
    return spec


@st.composite
def deployments(draw) -> dict:
    weights = draw(st.sampled_from([{"pvc": {"claimName": "w", "subPath": "m"}},
                                    {"hostPath": {"path": "/data"}}, {"image": True}]))
    kv = {"kvPort": 36000, "connector": draw(st.sampled_from(["MooncakeConnectorV2", "MooncakeConnectorV1"])),
          "timeouts": draw(st.sampled_from([{}, {"transferMs": 30000, "connectMs": 5000}]))}
    if draw(st.booleans()):
        kv["loadFailurePolicy"] = draw(st.sampled_from(["recompute", "fail"]))
    return {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": draw(st.from_regex(r"[a-z][a-z0-9]{0,11}", fullmatch=True)),
                         "namespace": draw(st.sampled_from(["default", "serving"]))},
            "spec": {"model": {"name": "/models/m", **draw(models), "weights": weights},
                     "image": {"name": "quay.io/ascend/vllm-ascend:v0.30.0rc2",
                               "pullSecrets": draw(st.sampled_from([[], ["regcred"]]))},
                     "kvTransfer": kv,
                     "prefill": draw(roles("prefill")), "decode": draw(roles("decode")),
                     "proxy": {"enabled": draw(st.booleans()), "replicas": draw(st.integers(0, 2))}}}


MB = 1 << 20
WRONG_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([-1, 0, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.just("x" * MB), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
UNICODE_NAMES = st.sampled_from(["名前", "glm-ﬂash", "ｇｌｍ", "glm\u200bflash", "Glm-Flash", "-glm", "glm-",
                                 "a" * 64, "a" * 254, "x" * MB, "", "glm flash", "glm_flash", "😀"])


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a document, parents before children."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += paths(value, (*prefix, i))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


@st.composite
def malformed(draw) -> Any:
    doc = copy.deepcopy(draw(deployments()))
    targets = paths(doc)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(targets))
        try:
            parent = _parent(doc, path)
            kind = draw(st.sampled_from(["wrong", "delete", "unknown", "huge-string"]))
            if kind == "wrong":
                parent[path[-1]] = draw(WRONG_VALUES)
            elif kind == "delete":
                del parent[path[-1]]
            elif kind == "unknown" and isinstance(parent, dict):
                parent[draw(st.sampled_from(["bogus", "replica", "x" * 300, "ü"]))] = draw(WRONG_VALUES)
            else:
                parent[path[-1]] = "y" * MB
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change removed or replaced the parent: keep what we have
    if isinstance(doc.get("metadata"), dict) and draw(st.booleans()):
        doc["metadata"]["name"] = draw(UNICODE_NAMES)
    return doc


@st.composite
def boundary(draw) -> dict:
    """A valid spec with one field at (or one past) the limit the API declares."""
    doc = copy.deepcopy(draw(deployments()))
    role = doc["spec"][draw(st.sampled_from(["prefill", "decode"]))]
    field, values = draw(st.sampled_from([
        ("replicas", [0, 512, 513, -1]), ("tensorParallelSize", [64, 65, 0]),
        ("dataParallelSize", [256, 257]),
        ("blockSize", [1, 1_048_576, 1_048_577]), ("kernelBlockSize", [1, 65_536, 65_537]),
        ("npusPerNode", [1, 64, 65]), ("numSpeculativeTokens", [64, 65]),
        ("startupTimeoutSeconds", [59, 60, 86_400, 86_401]),
        ("extraArgs", [["--enforce-eager"] * 128, ["--enforce-eager"] * 129]),
        ("env", [[{"name": f"V{i}", "value": "x"} for i in range(128)],
                 [{"name": f"V{i}", "value": "x"} for i in range(129)]]),
    ]))
    role[field] = draw(st.sampled_from(values))
    if draw(st.booleans()):
        doc["spec"]["kvTransfer"]["kvPort"] = draw(st.sampled_from([1023, 1024, 65535, 65536, 64000]))
    if draw(st.booleans()):
        doc["metadata"]["name"] = draw(st.sampled_from(["a", "a" * 20, "a" * 40, "a" * 63]))
    return doc


NOT_MAPPINGS = st.sampled_from([None, [], [1, 2], "PDDeployment", 42, 3.5, True, {"spec": None}, {}])
documents = st.one_of(deployments(), boundary(), malformed(), malformed(), NOT_MAPPINGS)
"""A mix: about a fifth valid, a fifth at the bounds, two fifths malformed, some not mappings."""

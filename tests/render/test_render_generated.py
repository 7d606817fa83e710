"""Generated valid specs render to manifests with every property the examples have, and random
documents never make the validator or the CLI raise: they give findings with field paths."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from render_cases import ROOT
from render_checks import check_all

from pd_operator.render import render
from pd_operator.spec.validate import validate

# celpy raises the recursion limit when it first builds its parser; do that before hypothesis runs
# (hypothesis warns when the limit changes under it).
validate({})

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
        spec["hostMounts"] = {"generation": draw(st.sampled_from(["A2", "A3", "A5", "none"])),
                              "paths": draw(st.sampled_from([[], [{"path": "/etc/hccn.conf"}]]))}
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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(deployments())
def test_generated_valid_specs_render_correctly(doc):
    validation = validate(doc)
    assume(validation.ok)
    with tempfile.TemporaryDirectory() as work:
        check_all(validation, render(validation.resolved), Path(work))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children,
                                                                      max_size=4),
    max_leaves=12)
SPEC_KEYS = ("model", "image", "kvTransfer", "prefill", "decode", "proxy", "servingPort")


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(SPEC_KEYS), json_values, max_size=7), st.data())
def test_random_specs_give_findings_with_paths(spec, data):
    base = {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": "x"}}
    validation = validate({**base, "spec": spec})
    assert not validation.ok or validation.deployment is not None
    for finding in validation.errors:
        assert finding.path and finding.message
    if validation.resolved is not None:
        render(validation.resolved)

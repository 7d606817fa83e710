"""User env and extraArgs cannot change what the operator sets: every owned env key and every
owned flag, under every spelling vLLM reads, is an error finding naming the field, the render is
refused, and the pod rendered from the spec without it carries the operator's value once."""

from __future__ import annotations

import copy

import pytest

from pd_operator.render import render
from pd_operator.render.runnable import validate
from pd_operator.spec.reserved import OWNED_ENV
from support.owned_flags import FREE_ARGS, HYBRID_OWNED_ARGS, VALUES, covers_every_owned_flag, spellings
from support.renders import VALID_EXAMPLES, container, serving_argv, serving_sets
from support.specs import example

BASE = example(next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-1p1d-tp4"))
A2 = example(next(p for p in VALID_EXAMPLES if p.stem == "qwen3-next-a2"))
DENSE = example(next(p for p in VALID_EXAMPLES if p.stem.startswith("deepseek")))  # MLA + indexer, no state


def with_role(doc: dict, role: str, **fields) -> dict:
    out = copy.deepcopy(doc)
    out["spec"][role].update(fields)
    return out


def test_every_owned_flag_has_a_test_value():
    assert covers_every_owned_flag()


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("key", sorted(OWNED_ENV))
def test_owned_env_is_refused(role, key):
    user_env = [{"name": "MY_VAR", "value": "1"}, {"name": key, "value": "user"}]
    validation = validate(with_role(BASE, role, env=user_env))
    found = [f for f in validation.errors if f.code == "EnvOverride"]
    assert [f.path for f in found] == [f"spec.{role}.env[1]"], [f.line() for f in validation.findings]
    assert key in found[0].message
    assert validation.resolved is None  # nothing to render: the type admits no unservable spec


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("words", [s for flag in sorted(VALUES) for s in spellings(flag)], ids=" ".join)
def test_owned_flag_is_refused_under_every_spelling(role, words):
    validation = validate(with_role(BASE, role, extraArgs=["--enforce-eager", *words]))
    found = [f for f in validation.errors if f.code == "ArgOverride"]
    assert [f.path for f in found] == [f"spec.{role}.extraArgs[1]"], [f.line() for f in validation.findings]
    assert validation.resolved is None  # nothing to render: the type admits no unservable spec


@pytest.mark.parametrize("words", FREE_ARGS, ids=" ".join)
def test_free_flags_are_not_refused(words):
    validation = validate(with_role(BASE, "decode", extraArgs=words))
    assert validation.ok, [f.line() for f in validation.errors]
    (decode,) = [s for s in serving_sets(render(validation.resolved)) if "decode" in s["metadata"]["name"]]
    assert serving_argv(decode)[-len(words):] == words


@pytest.mark.parametrize("words", HYBRID_OWNED_ARGS, ids=" ".join)
def test_prefix_caching_flags_are_owned_for_hybrid_models_only(words):
    hybrid = validate(with_role(BASE, "decode", extraArgs=words))
    assert [(f.code, f.path) for f in hybrid.errors] == [("ArgOverride", "spec.decode.extraArgs[0]")]
    dense = validate(with_role(DENSE, "decode", extraArgs=words))
    assert dense.ok, [f.line() for f in dense.errors]
    (decode,) = [s for s in serving_sets(render(dense.resolved)) if "decode" in s["metadata"]["name"]]
    argv = serving_argv(decode)
    assert argv[-len(words):] == words and "--no-enable-prefix-caching" not in argv[:-len(words)]


@pytest.mark.parametrize("doc", [BASE, A2], ids=["glm", "qwen-a2"])
def test_rendered_pods_carry_each_owned_key_once(doc):
    validation = validate(doc)
    spec = validation.deployment.spec
    user = [{"name": "OMP_NUM_THREADS", "value": "4"}, {"name": "MY_VAR", "value": "x"}]
    validation = validate(with_role(with_role(doc, "prefill", env=user), "decode", env=user))
    for sts in serving_sets(render(validation.resolved)):
        env = container(sts)["env"]
        names = [e["name"] for e in env]
        assert len(names) == len(set(names)), f"{sts['metadata']['name']}: duplicate env {names}"
        values = {e["name"]: e.get("value") for e in env}
        assert values["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # release images run these models on V1
        abort = spec.kv_transfer.timeouts.abort_request_seconds
        assert values["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] == str(abort)
        assert values["OMP_NUM_THREADS"] == "4" and values["MY_VAR"] == "x"
        argv = serving_argv(sts)
        long_flags = [w for w in argv if w.startswith("-") and w in VALUES]
        assert len(long_flags) == len(set(long_flags)), f"{sts['metadata']['name']}: {long_flags}"
        assert argv[argv.index("--port") + 1] == str(spec.serving_port)

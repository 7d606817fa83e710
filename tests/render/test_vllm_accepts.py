"""vLLM 0.34's own code accepts every rendered `vllm serve` argv and kv-transfer-config.

It runs `support/vllm_venv/serve_config.py` in `.vllm-venv` (vLLM 0.34.0's config code on CPU,
`make vllm-env`) once for all pods of all examples, and of each example with precise prefix routing
(`<example>+precise`: prefill caching prefixes and publishing KV events): building vLLM's parser
takes ~5 s.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from pd_operator.render import render
from support.renders import VALID_EXAMPLES, flag, pod_argvs, rendered, role_of
from support.specs import ROOT, resolve
from support.specs import example as example_doc

pytestmark = pytest.mark.vllm

VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
PRECISE, PRECISE_PORT = "+precise", 6100
CHECKER = ROOT / "tests" / "support" / "vllm_venv" / "serve_config.py"


@pytest.fixture(scope="module")
def pods(tmp_path_factory) -> list[tuple[str, str, int, list[str]]]:
    out = []
    for example in VALID_EXAMPLES:
        work = tmp_path_factory.mktemp(example.stem)
        for sts, ordinal, argv in pod_argvs(rendered(example), work):
            out.append((example.stem, f"{role_of(sts)} {sts['metadata']['name']}", ordinal, argv))
        doc = example_doc(example)
        doc["spec"]["prefill"]["enablePrefixCaching"] = True
        doc["spec"].setdefault("proxy", {})["routing"] = {"prefix": "precise", "kvEventsPort": PRECISE_PORT}
        work = tmp_path_factory.mktemp(f"{example.stem}-precise")
        for sts, ordinal, argv in pod_argvs(render(resolve(doc)), work):
            name = f"{role_of(sts)} {sts['metadata']['name']}"
            out.append((f"{example.stem}{PRECISE}", name, ordinal, argv))
    return out


def run_vllm(argvs: list[list[str]], kv_configs: list[dict]) -> dict:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env` to install vLLM's config code")
    proc = subprocess.run([str(VLLM_PYTHON), str(CHECKER)], input=json.dumps(
        {"argvs": argvs, "kv_configs": kv_configs}), capture_output=True, text=True, timeout=300,
        # Not HF_HUB_OFFLINE: with it vLLM resolves a model path that does not exist as a hub id.
        env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_vllm_accepts_every_rendered_pod(pods):
    argvs = [argv for *_, argv in pods]
    configs = [json.loads(flag(argv, "--kv-transfer-config")) for argv in argvs]
    # Two bad inputs prove the checker rejects what vLLM rejects.
    bad_argv = [*argvs[0][:3], "--block-size", "many"]
    bad_config = {**configs[0], "kv_role": "kv_sender"}
    result = run_vllm([*argvs, bad_argv], [*configs, bad_config])
    *parsed, bad_parsed = result["argvs"]
    *checked, bad_checked = result["kv_configs"]
    assert not bad_parsed["ok"] and not bad_checked["ok"]
    for (example, name, ordinal, argv), engine, config in zip(pods, parsed, checked, strict=True):
        where = f"{example}: {name} pod {ordinal}"
        assert engine["ok"], f"{where}: {engine['error']}"
        assert config["ok"], f"{where}: {config['error']}"
        # vLLM read the values the renderer meant, not something it recomputed.
        assert engine["block_size"] == int(flag(argv, "--block-size")), where
        # The role's prefix caching as rendered (None: vLLM's own default, for models without state).
        rendered_caching = (True if "--enable-prefix-caching" in argv else
                            False if "--no-enable-prefix-caching" in argv else None)
        assert engine["enable_prefix_caching"] == rendered_caching, where
        assert engine["tp"] == int(flag(argv, "--tensor-parallel-size")), where
        assert engine["dp"] == int(flag(argv, "--data-parallel-size")), where
        assert engine["headless"] == ("--headless" in argv), where
        if "--data-parallel-start-rank" in argv:
            assert engine["dp_start_rank"] == int(flag(argv, "--data-parallel-start-rank")), where
        # Precise prefix routing: vLLM reads prefill's events config as a ZMQ publisher on every
        # interface at the events port; nothing else publishes.
        events = engine["kv_events"] or {}
        if example.endswith(PRECISE) and name.startswith("prefill "):
            assert (events["enable_kv_cache_events"], events["publisher"], events["endpoint"]) == (
                True, "zmq", f"tcp://*:{PRECISE_PORT}"), where
        else:
            assert "--kv-events-config" not in argv and not events.get("enable_kv_cache_events"), where
        role = "kv_producer" if name.startswith("prefill ") else "kv_consumer"
        assert engine["kv_role"] == role and engine["engine_id"] == json.loads(
            flag(argv, "--kv-transfer-config"))["engine_id"], where


def test_glm_examples_ask_prefix_caching_on_prefill_only(pods):
    """The GLM examples cache prefixes on prefill (vLLM's align mode, planned) and not on decode."""
    glm = [(name, argv) for example, name, _, argv in pods if example.startswith("glm-")]
    assert glm
    for name, argv in glm:
        on_prefill = name.startswith("prefill ")
        assert ("--enable-prefix-caching" in argv) == on_prefill
        assert ("--no-enable-prefix-caching" in argv) == (not on_prefill)


def test_pods_cover_both_roles_and_a_headless_rank(pods):
    assert any(example.endswith(PRECISE) and "--kv-events-config" in argv for example, _, _, argv in pods)
    assert any("--headless" in argv for *_, argv in pods)
    assert {name.split()[0] for _, name, _, _ in pods} == {"prefill", "decode"}


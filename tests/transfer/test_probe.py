"""`pd-kv-probe` for real: a serving process and a checking process, each with its own Mooncake
engine, over P2P handshakes (how vllm-ascend's PD connectors discover peers)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from pd_operator.kv import presets
from pd_operator.kv.side import Side
from pd_operator.spec.pairing import PairInput, pair_from_rendered
from pd_operator.transfer.probe_geometry import probe_geometry
from support.kv_probe import LOOPBACK, PROBE, env, serve
from support.specs import EXAMPLES
from support.transfer_pairings import qwen3_next_kv_dims_config

pytestmark = pytest.mark.transfer

GLM_P8_D4 = ["--model", "glm-5.3-flash", "--prefill-tp", "8", "--decode-tp", "4"]

def check(peer: str, pairing: list[str]) -> tuple[int, dict]:
    done = subprocess.run([*PROBE, "check", "--peer", peer, *pairing, *LOOPBACK],
                          capture_output=True, text=True, env=env(), timeout=120)
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def served() -> Iterator[tuple[subprocess.Popen, str]]:
    proc, peer = serve(GLM_P8_D4)
    yield proc, peer
    proc.terminate()
    proc.wait(10)


def test_check_pulls_and_verifies_the_pairings_runs(served):
    _, peer = served
    code, result = check(peer, GLM_P8_D4)
    model = presets.get("glm-5.3-flash")
    geo = probe_geometry(PairInput(Side("prefill", model, 8), Side("decode", model, 4)))
    assert (code, result["errors"], result["ok"]) == (0, [], True)
    assert result["entries"] == geo.request.plan.entries
    assert result["bytes"] == geo.request.plan.bytes
    assert result["latencyMs"] > 0 and result["gbps"] > 0


@pytest.mark.parametrize("decode_block", [1280, 2304, 4352])
def test_one_prefill_serves_every_decode_block_size_of_its_decode_tp(served, decode_block):
    """A prefill served for decode TP4 at engine block 1152 is checked by TP4 decodes of other engine
    block sizes (a decode-only change): each pulls its own plan's runs and verifies them."""
    _, peer = served
    code, result = check(peer, [*GLM_P8_D4, "--decode-block-size", str(decode_block)])
    model = presets.get("glm-5.3-flash")
    decode = Side("decode", model, 4, block_size=decode_block)
    geo = probe_geometry(PairInput(Side("prefill", model, 8), decode))
    assert geo.decode.engine_block_size == decode_block
    assert (code, result["errors"], result["ok"]) == (0, [], True)
    assert (result["entries"], result["bytes"]) == (geo.request.plan.entries, geo.request.plan.bytes)


def test_check_refuses_a_prefill_rendered_for_another_decode_tp(served):
    """Decode TP8 has prefill's engine block (640), but the prefill engine was told decode TP4."""
    _, peer = served
    code, result = check(peer, ["--model", "glm-5.3-flash", "--prefill-tp", "8", "--decode-tp", "8"])
    assert code == 1 and not result["ok"] and result["bytes"] == 0
    assert result["errors"] == ["the peer serves another pairing: decode.tensorParallelSize: this side "
                                "has 8, the peer 4"]


def test_a_state_with_unequal_key_and_value_dims_crosses_tp_byte_for_byte(tmp_path):
    """The Qwen3-Next example, its model given as a config.json whose Gated DeltaNet key and value head dims
    differ (128, 64), prefill TP2 -> decode TP4: the check pulls every run of the plan and verifies it."""
    doc = yaml.safe_load((EXAMPLES / "qwen3-next-a2.yaml").read_text())
    model = doc["spec"]["model"]
    del model["preset"]
    model["hfConfig"] = qwen3_next_kv_dims_config()
    manifest = tmp_path / "qwen3-next-kv-dims.json"
    manifest.write_text(json.dumps(doc))
    geo = probe_geometry(pair_from_rendered(doc))
    assert {name for name, _ in geo.prefill.group("deltanet").tensors} == {"conv-qk", "conv-v", "recurrent"}
    proc, peer = serve(["--config", str(manifest)])
    try:
        code, result = check(peer, ["--config", str(manifest)])
    finally:
        proc.terminate()
        proc.wait(10)
    assert (code, result["errors"], result["ok"]) == (0, [], True)
    assert result["entries"] == geo.request.plan.entries
    assert result["bytes"] == geo.request.plan.bytes > 0


def test_check_refuses_a_peer_serving_another_pairing(served):
    _, peer = served
    code, result = check(peer, ["--model", "glm-5.3-flash", "--prefill-tp", "4",
                                                 "--decode-tp", "4"])
    assert code == 1 and not result["ok"] and result["bytes"] == 0
    (error,) = result["errors"]
    assert "the peer serves another pairing" in error
    assert "prefill.engineBlockSize: this side has 1152, the peer 640" in error


def test_check_fails_when_the_peer_is_gone(served):
    proc, peer = served
    proc.kill()
    proc.wait()
    code, result = check(peer, GLM_P8_D4)
    assert code == 1 and not result["ok"] and result["entries"] == 0
    assert f"cannot fetch the descriptor from http://{peer}/descriptor" in result["errors"][0]


@pytest.mark.parametrize("flags, message", [
    (["--model", "no-such-model", "--prefill-tp", "8", "--decode-tp", "4"],
     "--model: unknown model preset 'no-such-model'"),
    ([*GLM_P8_D4, "--layers", "0"], "--layers: 0 must be at least 1"),
    (["--model", "glm-5.3-flash", "--prefill-tp", "8", "--decode-tp", "3"], "the pairing is incompatible: "),
])
def test_bad_input_is_one_line_and_exit_2(flags, message):
    done = subprocess.run([*PROBE, "check", "--peer", "127.0.0.1:1", *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"pd-kv-probe: {message}")
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_gate_needs_its_peers():
    done = subprocess.run([*PROBE, "gate", *GLM_P8_D4], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("pd-kv-probe: gate needs --config")

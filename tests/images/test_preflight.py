"""The serving pod's preflight: pure checks, and the entrypoint run for real (it execs the command
when everything agrees, and exits 78 naming the problem when not)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pd_operator.findings import CATALOG
from pd_operator.preflight import (
    CROSS_TP_MIN_VERSION,
    PreflightConfig,
    parse_config,
    preflight,
    version_key,
)

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "images/vllm-ascend/entrypoint.py"

# GLM-5.3-Flash decode of a P=TP8 -> D=DP2xTP4 pairing: 1152-token blocks here, 640 on prefill.
CONFIG = {"role": "decode", "tensorParallelSize": 4, "dataParallelSize": 2, "engineBlockSize": 1152,
          "peerEngineBlockSize": 640, "kvConnector": "MooncakeConnectorV2", "ports": []}
KV = {"kv_connector": "MooncakeConnectorV2", "kv_role": "kv_consumer", "kv_port": "36000", "engine_id": "d0",
      "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 8},
                                    "decode": {"dp_size": 2, "tp_size": 4}}}
ENV = {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def argv(**overrides: str) -> list[str]:
    flags = {"--tensor-parallel-size": "4", "--data-parallel-size": "2", "--block-size": "1152",
             "--kv-transfer-config": json.dumps(KV), **overrides}
    return ["vllm", "serve", "zai/glm-5.3-flash", *[x for kv in flags.items() for x in kv]]


def run(config: dict = CONFIG, args: list[str] | None = None, env: dict = ENV, version: str | None = "0.32.0",
        npus: int | None = 8, busy: set[int] = frozenset()) -> list[tuple[str, str]]:
    cfg = PreflightConfig.model_validate(config)
    findings = preflight(cfg, args or argv(), env, version, npus, busy)
    for f in findings:
        assert f.code in CATALOG and f.message.endswith(".")
    return [(f.code, f.path) for f in findings]


def test_a_consistent_pod_passes():
    assert run() == []


def test_flags_that_disagree_with_the_rendered_pairing_are_named():
    assert run(args=argv(**{"--tensor-parallel-size": "8"})) == \
        [("PreflightShapeMismatch", "--tensor-parallel-size")]
    assert run(args=argv(**{"--block-size": "128"})) == [("PreflightShapeMismatch", "--block-size")]
    wrong_role = json.dumps({**KV, "kv_role": "kv_producer"})
    assert run(args=argv(**{"--kv-transfer-config": wrong_role})) == \
        [("PreflightShapeMismatch", "--kv-transfer-config.kv_role")]
    extra = json.dumps({**KV, "kv_connector_extra_config": {"decode": {"dp_size": 2, "tp_size": 2}}})
    assert run(args=argv(**{"--kv-transfer-config": extra})) == \
        [("PreflightShapeMismatch", "--kv-transfer-config.kv_connector_extra_config.decode.tp_size")]
    assert run(args=argv(**{"--kv-transfer-config": "{not json"})) == \
        [("PreflightShapeMismatch", "--kv-transfer-config")]


def test_too_few_npus_for_the_local_ranks():
    assert run(npus=4) == [("PreflightShapeMismatch", "resources")]
    assert run(config={**CONFIG, "dataParallelSizeLocal": 1}, npus=4) == []
    assert run(npus=None) == []  # unknown (no device listing): not judged


@pytest.mark.parametrize("version, ok", [(None, False), ("0.23.0", False), ("0.32.0rc0", False),
                                         (CROSS_TP_MIN_VERSION, True), ("0.32.0", True), ("0.34.1", True)])
def test_unequal_block_sizes_need_a_cross_tp_vllm_ascend(version, ok):
    found = run(version=version)
    assert found == ([] if ok else [("ConnectorVersionTooOld", "image")])


def test_equal_block_sizes_need_no_particular_version():
    assert run(config={**CONFIG, "peerEngineBlockSize": 1152}, version=None) == []


def test_v2_connector_needs_the_v2_model_runner():
    assert run(env={}) == [("ModelRunnerV2Disabled", "env.VLLM_USE_V2_MODEL_RUNNER")]


def test_busy_ports():
    found = run(config={**CONFIG, "ports": [8000, 36000]}, busy={36000})
    assert found == [("PreflightPortBusy", "ports.36000")]


def test_version_order():
    keys = [version_key(v) for v in ("0.32.0rc1", "0.32.0rc2", "0.32.0", "v0.32.1")]
    assert keys == sorted(keys) and len(set(keys)) == 4
    assert version_key("not a version") is None


def test_bad_config_names_the_field():
    config, findings = parse_config(json.dumps({**CONFIG, "tensorParallelSize": 0}), "/etc/x.json")
    assert config is None
    assert [(f.code, f.path) for f in findings] == \
        [("PreflightConfigInvalid", "/etc/x.json:tensorParallelSize")]
    _, findings = parse_config("{", "/etc/x.json")
    assert findings[0].code == "PreflightConfigInvalid" and "not JSON" in findings[0].message


# --- the entrypoint, run for real ------------------------------------------------------------------

def entrypoint(tmp_path: Path, config: dict | None, command: list[str]) -> subprocess.CompletedProcess:
    path = tmp_path / "preflight.json"
    if config is not None:
        path.write_text(json.dumps(config))
    env = {**os.environ, **ENV, "PD_PREFLIGHT_CONFIG": str(path),
           "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    return subprocess.run([sys.executable, str(ENTRYPOINT), *command], capture_output=True, text=True,
                          env=env, timeout=60)


def served_command() -> list[str]:
    """A stand-in for `vllm serve` that prints what it was given (the flags are what is judged)."""
    return ["/bin/echo", *argv()[1:]]


def test_entrypoint_execs_the_command_when_everything_agrees(tmp_path):
    same_blocks = {**CONFIG, "peerEngineBlockSize": 1152}  # no vllm-ascend on this machine
    done = entrypoint(tmp_path, same_blocks, served_command())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("serve zai/glm-5.3-flash --tensor-parallel-size 4")


def test_entrypoint_names_the_required_version_and_does_not_exec(tmp_path):
    done = entrypoint(tmp_path, CONFIG, served_command())
    assert done.returncode == 78 and done.stdout == ""
    assert f"vllm-ascend {CROSS_TP_MIN_VERSION} or later; the image has no vllm-ascend" in done.stderr
    assert "Traceback" not in done.stderr


def test_entrypoint_refuses_a_port_in_use(tmp_path):
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        config = {**CONFIG, "peerEngineBlockSize": 1152, "ports": [port]}
        done = entrypoint(tmp_path, config, served_command())
    assert done.returncode == 78 and f"PreflightPortBusy at ports.{port}" in done.stderr


def test_entrypoint_without_the_rendered_config(tmp_path):
    done = entrypoint(tmp_path, None, served_command())
    assert done.returncode == 78
    assert "PreflightConfigInvalid" in done.stderr and "cannot be read" in done.stderr
    assert "Traceback" not in done.stderr

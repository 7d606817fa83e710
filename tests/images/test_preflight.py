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
from vllm_ascend_tree import write_tree

from pd_operator.findings import CATALOG
from pd_operator.image_check import Installed, introspect
from pd_operator.images import capabilities
from pd_operator.preflight import PreflightConfig, parse_config, preflight

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "images/vllm-ascend/entrypoint.py"

# GLM-5.3-Flash decode of a P=TP8 -> D=DP2xTP4 pairing on a seed image: 1152-token blocks here, 640
# on prefill.
SEED_IMAGE = capabilities("registry.example.com/pd-vllm-ascend:v0.30.0rc2-pr16755", "0.30.0rc2", True)
assert SEED_IMAGE is not None
CONFIG = {"role": "decode", "tensorParallelSize": 4, "dataParallelSize": 2, "engineBlockSize": 1152,
          "kvConnector": "MooncakeConnectorV2", "ports": [],
          "image": SEED_IMAGE.to_wire()}
KV = {"kv_connector": "MooncakeConnectorV2", "kv_role": "kv_consumer", "kv_port": "36000", "engine_id": "d0",
      "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 8},
                                    "decode": {"dp_size": 2, "tp_size": 4}}}

@pytest.fixture(scope="module")
def seed_tree(tmp_path_factory) -> Path:
    return write_tree(tmp_path_factory.mktemp("seed"))


@pytest.fixture(scope="module")
def seed_image(seed_tree) -> Installed:
    return introspect(seed_tree, commit_file=seed_tree / "no-commit-file")


def argv(**overrides: str) -> list[str]:
    flags = {"--tensor-parallel-size": "4", "--data-parallel-size": "2", "--block-size": "1152",
             "--kv-transfer-config": json.dumps(KV), **overrides}
    return ["vllm", "serve", "zai/glm-5.3-flash", *[x for kv in flags.items() for x in kv]]


def run(installed: Installed | None, config: dict = CONFIG, args: list[str] | None = None,
        npus: int | None = 8, busy: set[int] = frozenset()) -> list[tuple[str, str]]:
    cfg = PreflightConfig.model_validate(config)
    findings = preflight(cfg, args or argv(), installed, npus, busy)
    for f in findings:
        assert f.code in CATALOG and f.message.endswith(".")
    return [(f.code, f.path) for f in findings]


def test_a_consistent_pod_passes(seed_image):
    assert run(seed_image) == []


def test_flags_that_disagree_with_the_rendered_pairing_are_named(seed_image):
    assert run(seed_image, args=argv(**{"--tensor-parallel-size": "8"})) == \
        [("PreflightShapeMismatch", "--tensor-parallel-size")]
    assert run(seed_image, args=argv(**{"--block-size": "128"})) == \
        [("PreflightShapeMismatch", "--block-size")]
    wrong_role = json.dumps({**KV, "kv_role": "kv_producer"})
    assert run(seed_image, args=argv(**{"--kv-transfer-config": wrong_role})) == \
        [("PreflightShapeMismatch", "--kv-transfer-config.kv_role")]
    extra = json.dumps({**KV, "kv_connector_extra_config": {"decode": {"dp_size": 2, "tp_size": 2}}})
    assert run(seed_image, args=argv(**{"--kv-transfer-config": extra})) == \
        [("PreflightShapeMismatch", "--kv-transfer-config.kv_connector_extra_config.decode.tp_size")]
    assert run(seed_image, args=argv(**{"--kv-transfer-config": "{not json"})) == \
        [("PreflightShapeMismatch", "--kv-transfer-config")]


def test_too_few_npus_for_the_local_ranks(seed_image):
    assert run(seed_image, npus=4) == [("PreflightShapeMismatch", "resources")]
    assert run(seed_image, config={**CONFIG, "dataParallelSizeLocal": 1}, npus=4) == []
    assert run(seed_image, npus=None) == []  # unknown (no device listing): not judged


def test_the_image_is_checked_against_the_claim_by_its_code_not_its_version(tmp_path):
    no_seed = introspect(write_tree(tmp_path / "stock", version="0.30.0rc2", seed=False))
    assert run(no_seed) == [("PreflightImageMismatch", "spec.image.seedChange")]
    no_v2 = introspect(write_tree(tmp_path / "old", v2=False, glm_next=False))
    assert run(no_v2) == [("PreflightImageMismatch", "spec.image.seedChange"),
                          ("PreflightImageMismatch", "spec.kvTransfer.connector"),
                          ("PreflightImageMismatch", "spec.image.vllmAscendVersion")]
    assert run(None) == [("PreflightImageMismatch", "spec.image.name")]
    stock_claim = capabilities("quay.io/ascend/vllm-ascend:v0.30.0rc2")
    assert stock_claim is not None
    assert run(no_seed, config={**CONFIG, "image": stock_claim.to_wire()}) == []


def test_busy_ports(seed_image):
    found = run(seed_image, config={**CONFIG, "ports": [8000, 36000]}, busy={36000})
    assert found == [("PreflightPortBusy", "ports.36000")]


def test_bad_config_names_the_field():
    config, findings = parse_config(json.dumps({**CONFIG, "tensorParallelSize": 0}), "/etc/x.json")
    assert config is None
    assert [(f.code, f.path) for f in findings] == \
        [("PreflightConfigInvalid", "/etc/x.json:tensorParallelSize")]
    _, findings = parse_config("{", "/etc/x.json")
    assert findings[0].code == "PreflightConfigInvalid" and "not JSON" in findings[0].message


# --- the entrypoint, run for real ------------------------------------------------------------------

def entrypoint(tmp_path: Path, config: dict | None, command: list[str],
               vllm_ascend: Path | None = None) -> subprocess.CompletedProcess:
    """Run the entrypoint with `vllm_ascend` (a source tree) on its import path, as the image has it."""
    path = tmp_path / "preflight.json"
    if config is not None:
        path.write_text(json.dumps(config))
    env = {**os.environ, "PD_PREFLIGHT_CONFIG": str(path), "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
           "PYTHONPATH": os.pathsep.join(str(p) for p in (vllm_ascend, ROOT / "operator") if p)}
    return subprocess.run([sys.executable, str(ENTRYPOINT), *command], capture_output=True, text=True,
                          env=env, timeout=60)


def served_command() -> list[str]:
    """A stand-in for `vllm serve` that prints what it was given (the flags are what is judged)."""
    return ["/bin/echo", *argv()[1:]]


def test_entrypoint_execs_the_command_when_everything_agrees(tmp_path, seed_tree):
    done = entrypoint(tmp_path, CONFIG, served_command(), seed_tree)
    assert done.returncode == 0, done.stderr
    assert f"preflight: vllm-ascend 0.30.0rc3.dev1 (g0123abc) at {seed_tree}" in done.stderr
    assert done.stdout.startswith("serve zai/glm-5.3-flash --tensor-parallel-size 4")


def test_entrypoint_refuses_an_image_without_the_claimed_seed_and_does_not_exec(tmp_path):
    stock = write_tree(tmp_path / "stock", seed=False)
    done = entrypoint(tmp_path, CONFIG, served_command(), stock)
    assert done.returncode == 78 and done.stdout == ""
    assert "PreflightImageMismatch at spec.image.seedChange" in done.stderr
    assert f"vllm-ascend 0.30.0rc3.dev1 (g0123abc) at {stock}" in done.stderr
    assert "Traceback" not in done.stderr
    done = entrypoint(tmp_path, CONFIG, served_command())  # no vllm-ascend at all
    assert done.returncode == 78 and "No vllm-ascend is installed" in done.stderr


def test_entrypoint_refuses_a_port_in_use(tmp_path, seed_tree):
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        config = {**CONFIG, "ports": [port]}
        done = entrypoint(tmp_path, config, served_command(), seed_tree)
    assert done.returncode == 78 and f"PreflightPortBusy at ports.{port}" in done.stderr


def test_entrypoint_without_the_rendered_config(tmp_path):
    done = entrypoint(tmp_path, None, served_command())
    assert done.returncode == 78
    assert "PreflightConfigInvalid" in done.stderr and "cannot be read" in done.stderr
    assert "Traceback" not in done.stderr

"""The serving pod's preflight checks, pure (pd_operator.preflight), and `pd-preflight`'s own
handling of a missing config or command. The rendered pods' commands run through it for real in
tests/render/test_pod_preflight.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pd_operator.findings import CATALOG
from pd_operator.preflight import (
    CROSS_TP_MIN_VERSION,
    PreflightConfig,
    check_version,
    parse_config,
    preflight,
    version_key,
)
from pd_operator.preflight_cli import visible_npus

# GLM-5.3-Flash decode of a P=TP8 -> D=DP2xTP4 pairing: 1152-token blocks here, 640 on prefill.
CONFIG = {"role": "decode", "tensorParallelSize": 4, "dataParallelSize": 2, "dataParallelSizeLocal": 2,
          "engineBlockSize": 1152, "peerEngineBlockSize": 640, "kvConnector": "MooncakeConnectorV2",
          "npusPerPod": 8, "ports": [[8000, 36000]]}
# DP4 x TP4 decode over two pods of 8 NPUs (two DP ranks each).
MULTI_POD = {**CONFIG, "dataParallelSize": 4, "pods": 2, "ports": [[8000, 36000], [8000, 36008]]}
KV = {"kv_connector": "MooncakeConnectorV2", "kv_role": "kv_consumer", "kv_port": "36000", "engine_id": "d0",
      "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 8},
                                    "decode": {"dp_size": 2, "tp_size": 4}}}
ENV = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
KV_DP4 = json.dumps({**KV, "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 8},
                                                         "decode": {"dp_size": 4, "tp_size": 4}}})


def multi_pod_argv(ordinal: int) -> list[str]:
    """What the rendered prelude gives pod `ordinal` of the DP4 x TP4 decode."""
    return argv("--data-parallel-size-local", "2", *(["--headless"] if ordinal else []),
                "--data-parallel-start-rank", str(2 * ordinal),
                **{"--data-parallel-size": "4", "--kv-transfer-config": KV_DP4})


def argv(*extra: str, **overrides: str) -> list[str]:
    flags = {"--tensor-parallel-size": "4", "--data-parallel-size": "2", "--block-size": "1152",
             "--kv-transfer-config": json.dumps(KV), **overrides}
    return ["vllm", "serve", "zai/glm-5.3-flash", *[x for kv in flags.items() for x in kv], *extra]


def run(config: dict = CONFIG, args: list[str] | None = None, env: dict = ENV, npus: int | None = 8,
        busy: frozenset[int] = frozenset(), image: tuple = ()) -> list[tuple[str, str]]:
    cfg = PreflightConfig.model_validate(config)
    findings = preflight(cfg, args or argv(), env, npus, busy, list(image))
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
    assert run(args=["python3", "-m", "something"]) == [("PreflightShapeMismatch", "argv")]


def test_multi_pod_flags_follow_the_pods_ordinal():
    leader, second = multi_pod_argv(0), multi_pod_argv(1)
    assert run(MULTI_POD, leader, {**ENV, "PD_POD_INDEX": "0"}) == []
    assert run(MULTI_POD, second, {**ENV, "PD_POD_INDEX": "1"}) == []
    assert run(MULTI_POD, leader, {**ENV, "PD_POD_INDEX": "1"}) == \
        [("PreflightShapeMismatch", "--headless"), ("PreflightShapeMismatch", "--data-parallel-start-rank")]
    assert run(MULTI_POD, leader, ENV) == [("PreflightShapeMismatch", "env.PD_POD_INDEX")]


def test_too_few_npus_for_the_local_ranks():
    assert run(npus=4) == [("PreflightShapeMismatch", "resources")]
    assert run(npus=None) == [("PreflightShapeMismatch", "resources")]  # none to be seen at all
    assert run(config={**CONFIG, "npusPerPod": 4}, npus=4) == []


def test_npus_come_from_the_device_plugins_grant():
    assert visible_npus({"ASCEND_VISIBLE_DEVICES": "0,1,2,3"}) == 4
    # The runtime's own narrowing wins over the plugin's grant.
    assert visible_npus({"ASCEND_VISIBLE_DEVICES": "0,1,2,3", "ASCEND_RT_VISIBLE_DEVICES": "0,1"}) == 2


def test_image_findings_are_reported_as_given():
    image = check_version(PreflightConfig.model_validate(CONFIG), ENV, "0.23.0")
    assert run(image=tuple(image)) == [("ConnectorVersionTooOld", "image")]


@pytest.mark.parametrize("version, ok", [(None, False), ("0.23.0", False), ("0.32.0rc0", False),
                                         (CROSS_TP_MIN_VERSION, True), ("0.32.0", True), ("0.34.1", True)])
def test_unequal_block_sizes_need_a_cross_tp_vllm_ascend(version, ok):
    found = check_version(PreflightConfig.model_validate(CONFIG), ENV, version)
    assert [(f.code, f.path) for f in found] == ([] if ok else [("ConnectorVersionTooOld", "image")])


def test_equal_block_sizes_need_no_particular_version():
    config = PreflightConfig.model_validate({**CONFIG, "peerEngineBlockSize": 1152})
    assert check_version(config, ENV, None) == []


def test_v2_connector_needs_the_v2_model_runner():
    found = check_version(PreflightConfig.model_validate(CONFIG), {}, "0.32.0")
    assert [(f.code, f.path) for f in found] == [("ModelRunnerV2Disabled", "env.VLLM_USE_V2_MODEL_RUNNER")]


def test_busy_ports_of_this_pod():
    assert run(busy=frozenset({36000})) == [("PreflightPortBusy", "ports.36000")]
    second = {**ENV, "PD_POD_INDEX": "1"}
    assert run(MULTI_POD, multi_pod_argv(1), second, busy=frozenset({36000, 36008})) == \
        [("PreflightPortBusy", "ports.36008")]


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


def pd_preflight(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pd_operator.preflight_cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_a_missing_config_refuses_with_its_path(tmp_path):
    done = pd_preflight("--config", str(tmp_path / "none.json"), "--", "/bin/echo", "never")
    assert done.returncode == 78 and done.stdout == ""
    assert f"PreflightConfigInvalid at {tmp_path / 'none.json'}" in done.stderr
    assert "cannot be read" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_command_refuses(tmp_path):
    done = pd_preflight("--config", str(tmp_path / "none.json"))
    assert done.returncode == 78 and "no command to run" in done.stderr

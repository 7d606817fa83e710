"""The serving pod's preflight checks, pure (pd_operator.preflight.checks), and `pd-preflight` run for real:
its handling of a missing config or command, and of the image it finds installed (a stand-in
vllm-ascend source tree on its import path). The rendered pods' commands run through it for real in
tests/render/test_pod_preflight.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pd_operator.findings import CATALOG
from pd_operator.preflight.checks import PreflightConfig, parse_config, preflight
from pd_operator.preflight.cli import busy, visible_npus
from pd_operator.serving_image.capabilities import capabilities
from pd_operator.serving_image.installed import Installed, introspect, read_report
from support.vllm_ascend_tree import write_tree

# GLM-5.3-Flash decode of a P=TP8 -> D=DP2xTP4 pairing on a seed image: 1152-token blocks here, 640
# on prefill.
SEED_IMAGE = capabilities("registry.example.com/pd-vllm-ascend:v0.30.0rc2-pr16755", "0.30.0rc2", True)
assert SEED_IMAGE is not None
CONFIG = {"role": "decode", "tensorParallelSize": 4, "dataParallelSize": 2, "dataParallelSizeLocal": 2,
          "engineBlockSize": 1152, "kvConnector": "MooncakeConnectorV2", "npusPerPod": 8,
          "ports": [[8000, 36000]], "image": SEED_IMAGE.to_wire()}
# DP4 x TP4 decode over two pods of 8 NPUs (two DP ranks each).
MULTI_POD = {**CONFIG, "dataParallelSize": 4, "pods": 2, "ports": [[8000, 36000], [8000, 36008]]}
KV = {"kv_connector": "MooncakeConnectorV2", "kv_role": "kv_consumer", "kv_port": "36000", "engine_id": "d0",
      "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 8},
                                    "decode": {"dp_size": 2, "tp_size": 4}}}
KV_DP4 = json.dumps({**KV, "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 8},
                                                         "decode": {"dp_size": 4, "tp_size": 4}}})


@pytest.fixture(scope="module")
def seed_tree(tmp_path_factory) -> Path:
    return write_tree(tmp_path_factory.mktemp("seed"))


@pytest.fixture(scope="module")
def seed_image(seed_tree) -> Installed:
    return introspect(seed_tree, commit_file=seed_tree / "no-commit-file")


def multi_pod_argv(ordinal: int) -> list[str]:
    """What the rendered prelude gives pod `ordinal` of the DP4 x TP4 decode."""
    return argv("--data-parallel-size-local", "2", *(["--headless"] if ordinal else []),
                "--data-parallel-start-rank", str(2 * ordinal),
                **{"--data-parallel-size": "4", "--kv-transfer-config": KV_DP4})


def argv(*extra: str, **overrides: str) -> list[str]:
    flags = {"--tensor-parallel-size": "4", "--data-parallel-size": "2", "--block-size": "1152",
             "--kv-transfer-config": json.dumps(KV), **overrides}
    return ["vllm", "serve", "zai/glm-5.3-flash", *[x for kv in flags.items() for x in kv], *extra]


def run(installed: Installed | None, config: dict = CONFIG, args: list[str] | None = None,
        env: dict | None = None, npus: int | None = 8,
        busy: frozenset[int] = frozenset()) -> list[tuple[str, str]]:
    cfg = PreflightConfig.model_validate(config)
    findings = preflight(cfg, args or argv(), env or {}, npus, busy, installed)
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
    assert run(seed_image, args=["python3", "-m", "something"]) == [("PreflightShapeMismatch", "argv")]


def test_multi_pod_flags_follow_the_pods_ordinal(seed_image):
    leader, second = multi_pod_argv(0), multi_pod_argv(1)
    assert run(seed_image, MULTI_POD, leader, {"PD_POD_INDEX": "0"}) == []
    assert run(seed_image, MULTI_POD, second, {"PD_POD_INDEX": "1"}) == []
    assert run(seed_image, MULTI_POD, leader, {"PD_POD_INDEX": "1"}) == \
        [("PreflightShapeMismatch", "--headless"), ("PreflightShapeMismatch", "--data-parallel-start-rank")]
    assert run(seed_image, MULTI_POD, leader, {}) == [("PreflightShapeMismatch", "env.PD_POD_INDEX")]


def test_too_few_npus_for_the_local_ranks(seed_image):
    assert run(seed_image, npus=4) == [("PreflightShapeMismatch", "resources")]
    assert run(seed_image, npus=None) == [("PreflightShapeMismatch", "resources")]  # none to be seen at all
    assert run(seed_image, config={**CONFIG, "npusPerPod": 4}, npus=4) == []


def test_npus_come_from_the_device_plugins_grant():
    assert visible_npus({"ASCEND_VISIBLE_DEVICES": "0,1,2,3"}) == 4
    # The runtime's own narrowing wins over the plugin's grant.
    assert visible_npus({"ASCEND_VISIBLE_DEVICES": "0,1,2,3", "ASCEND_RT_VISIBLE_DEVICES": "0,1"}) == 2


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


def test_busy_ports_of_this_pod(seed_image):
    assert run(seed_image, busy=frozenset({36000})) == [("PreflightPortBusy", "ports.36000")]
    assert run(seed_image, MULTI_POD, multi_pod_argv(1), {"PD_POD_INDEX": "1"},
               busy=frozenset({36000, 36008})) == [("PreflightPortBusy", "ports.36008")]


def test_a_listening_port_is_busy_and_a_killed_engines_time_wait_is_not():
    """What the real node showed: an engine SIGKILLed with a client connected leaves the server side
    of that connection in TIME_WAIT, which vLLM's own bind (SO_REUSEADDR) ignores; the preflight of the
    restarted container must too (Linux lets a bind reuse a TIME_WAIT port when both sockets set
    SO_REUSEADDR, as vLLM's server socket does)."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        server.listen()
        assert busy([port]) == {port}
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server side closes first: it holds TIME_WAIT
            client.recv(1)
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("0.0.0.0", port))  # a bind without SO_REUSEADDR still fails
    assert busy([port]) == set()


def test_bad_config_names_the_field():
    config, findings = parse_config(json.dumps({**CONFIG, "tensorParallelSize": 0}), "/etc/x.json")
    assert config is None
    assert [(f.code, f.path) for f in findings] == \
        [("PreflightConfigInvalid", "/etc/x.json:tensorParallelSize")]
    _, findings = parse_config("{", "/etc/x.json")
    assert findings[0].code == "PreflightConfigInvalid" and "not JSON" in findings[0].message


# --- pd-preflight, run for real ----------------------------------------------------------------------

def pd_preflight(*args: str, vllm_ascend: Path | None = None) -> subprocess.CompletedProcess:
    """Run pd-preflight with `vllm_ascend` (a source tree) on its import path, as the image has it."""
    env = {**os.environ, "ASCEND_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
           "PYTHONPATH": str(vllm_ascend) if vllm_ascend else ""}
    return subprocess.run([sys.executable, "-m", "pd_operator.preflight.cli", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def served(tmp_path: Path) -> list[str]:
    """Arguments for a config without ports (this machine's are not the pod's) and a stand-in `vllm`
    that prints what it was given (the flags are what is judged)."""
    path = tmp_path / "preflight-decode.json"
    path.write_text(json.dumps({**CONFIG, "ports": []}))
    vllm = tmp_path / "bin" / "vllm"
    vllm.parent.mkdir(exist_ok=True)
    vllm.write_text('#!/bin/sh\necho "$@"\n')
    vllm.chmod(0o755)
    return ["--config", str(path), "--", str(vllm), *argv()[1:]]


def test_pd_preflight_names_the_image_it_found_and_execs(tmp_path, seed_tree):
    done = pd_preflight(*served(tmp_path), vllm_ascend=seed_tree)
    assert done.returncode == 0, done.stderr
    assert f"pd-preflight: vllm-ascend 0.30.0rc3.dev1 (g0123abc) at {seed_tree}" in done.stderr
    assert done.stdout.startswith("serve zai/glm-5.3-flash --tensor-parallel-size 4")


def test_pd_preflight_refuses_an_image_without_the_claimed_seed_and_does_not_exec(tmp_path):
    stock = write_tree(tmp_path / "stock", seed=False)
    done = pd_preflight(*served(tmp_path), vllm_ascend=stock)
    assert done.returncode == 78 and done.stdout == ""
    assert "PreflightImageMismatch at spec.image.seedChange" in done.stderr
    assert f"vllm-ascend 0.30.0rc3.dev1 (g0123abc) at {stock}" in done.stderr
    assert "Traceback" not in done.stderr
    done = pd_preflight(*served(tmp_path))  # no vllm-ascend at all
    assert done.returncode == 78 and "No vllm-ascend is installed" in done.stderr


def test_a_missing_config_refuses_with_its_path(tmp_path):
    done = pd_preflight("--config", str(tmp_path / "none.json"), "--", "/bin/echo", "never")
    assert done.returncode == 78 and done.stdout == ""
    assert f"PreflightConfigInvalid at {tmp_path / 'none.json'}" in done.stderr
    assert "cannot be read" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_command_refuses(tmp_path):
    done = pd_preflight("--config", str(tmp_path / "none.json"))
    assert done.returncode == 78 and "no command to run" in done.stderr


# --- the image report (pd-preflight --report, read back as the operator reads pod status) -----------

def test_pd_preflight_reports_the_image_for_the_status(tmp_path, seed_tree):
    message = tmp_path / "termination-log"
    done = pd_preflight("--report", str(message), vllm_ascend=seed_tree)
    assert done.returncode == 0, done.stderr
    assert read_report(message.read_text()) == "0.30.0rc3.dev1 (commit g0123abc), seed change"
    done = pd_preflight("--report", str(message), vllm_ascend=write_tree(tmp_path / "stock", seed=False))
    assert read_report(message.read_text()) == "0.30.0rc3.dev1 (commit g0123abc), no seed change"
    done = pd_preflight("--report", str(message))  # no vllm-ascend at all
    assert done.returncode == 0 and read_report(message.read_text()) == "not installed"
    # Information only: a report that cannot be written never stops the pod.
    done = pd_preflight("--report", str(tmp_path / "no-such-dir" / "log"), vllm_ascend=seed_tree)
    assert done.returncode == 0 and "cannot write" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("message", [
    None, 17, "", "not json", "[]", '{"other": 1}', '{"vllmAscend": []}', '{"vllmAscend": "0.30"}',
    "x" * 5000,
])
def test_a_report_that_is_not_one_is_nothing(message):
    assert read_report(message) is None


def test_a_report_keeps_only_plain_short_fields():
    text = json.dumps({"vllmAscend": {"version": "0.30.0rc2\n<script>", "commit": "a" * 64,
                                      "seedChange": "yes"}})
    assert read_report(text) == f"unknown version (commit {'a' * 64}), no seed change"
    too_long = json.dumps({"vllmAscend": {"version": "x" * 65, "commit": None, "seedChange": True}})
    assert read_report(too_long) == "unknown version, seed change"

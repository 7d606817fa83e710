"""Every rendered serving pod starts through `pd-preflight`, run for real: the files the pod would
see are laid out (support.renders.run_pod), a recorder stands in for `vllm`, and the preflight must
exec it with exactly the rendered argv, and refuse, naming the finding, a pod whose argv, NPU
grant or image was tampered with.

Each pod runs as in the image its container names, by the image model (support.image_model: only that
image's commands and packages, so not this venv's pd_operator), with the tools bundle laid out where
the init container puts it; without the bundle it does not start.

The image is what `pd-preflight` finds installed (pd_operator.serving_image.installed reads its source and
preflight.check_image judges it against the rendered claim); here a stand-in vllm-ascend source tree
is laid out on PYTHONPATH, as the serving image has it installed.
"""

from __future__ import annotations

import copy
import json

import pytest

from pd_operator.render import render
from pd_operator.serving_image import bundle
from support.renders import VALID_EXAMPLES, container, image_of, role_of, run_pod, serving_sets
from support.specs import example, resolve

GLM = next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-tp8-dp2tp4")
MULTI_POD = next(p for p in VALID_EXAMPLES if p.stem.startswith("deepseek"))
EX_CONFIG = 78


def _manifests(path) -> list[dict]:
    return render(resolve(example(path)))


def _decode(manifests: list[dict]) -> dict:
    return next(s for s in serving_sets(manifests) if role_of(s) == "decode")


def _rendered_vllm_argv(cont: dict) -> list[str]:
    """The `vllm serve ...` part of the rendered command (before any per-pod flags)."""
    command = cont["command"]
    return command[command.index("--") + 1:]


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_every_rendered_pod_passes_its_preflight_and_execs_the_rendered_argv(path, tmp_path):
    manifests = _manifests(path)
    for sts in serving_sets(manifests):
        cont = container(sts)
        start = cont["command"].index("python3")
        assert cont["command"][start:start + 5] == \
            [*bundle.command("pd-preflight"), "--config", f"/etc/pd/preflight-{role_of(sts)}.json", "--"]
        for ordinal in range(sts["spec"]["replicas"]):
            run = run_pod(manifests, sts, ordinal, tmp_path / f"{sts['metadata']['name']}-{ordinal}")
            assert run.returncode == 0, run.stderr
            rendered = _rendered_vllm_argv(cont)
            # Exactly the rendered argv; a multi-pod instance's prelude only appends its per-pod flags.
            assert run.argv[:len(rendered)] == rendered
            extra = run.argv[len(rendered):]
            if sts["spec"]["replicas"] == 1:
                assert extra == []
            else:
                local = int(rendered[rendered.index("--data-parallel-size-local") + 1])
                assert extra == [*(["--headless"] if ordinal else []), "--data-parallel-start-rank",
                                 str(ordinal * local)]


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_without_the_tools_bundle_no_pod_starts(path, tmp_path):
    """The bundle is the only pd_operator the pod's python3 finds: without the init container's copy,
    the command fails before `vllm serve`."""
    manifests = _manifests(path)
    sts = serving_sets(manifests)[0]
    run = run_pod(manifests, sts, 0, tmp_path / "pod", bundled=False)
    assert run.returncode != 0 and run.argv is None
    assert f"{bundle.MOUNT.rsplit('/', 1)[1]}/pd-preflight" in run.stderr  # python3: can't open file ...


def _refused(run, code: str, path: str) -> None:
    assert run.returncode == EX_CONFIG and run.argv is None, run
    assert f"error: {code} at {path}:" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def _edited(cont: dict, flag: str, value: str) -> dict:
    out = copy.deepcopy(cont)
    out["command"][out["command"].index(flag) + 1] = value
    return out


@pytest.mark.parametrize(("flag", "value", "path"), [
    ("--tensor-parallel-size", "8", "--tensor-parallel-size"),
    ("--block-size", "128", "--block-size"),
])
def test_a_tampered_argv_is_refused(flag, value, path, tmp_path):
    manifests = _manifests(GLM)
    sts = _decode(manifests)
    run = run_pod(manifests, sts, 0, tmp_path, cont=_edited(container(sts), flag, value))
    _refused(run, "PreflightShapeMismatch", path)


def test_a_tampered_kv_transfer_config_is_refused(tmp_path):
    manifests = _manifests(GLM)
    sts = _decode(manifests)
    cont = container(sts)
    kv = json.loads(cont["command"][cont["command"].index("--kv-transfer-config") + 1])
    kv["kv_role"] = "kv_producer"
    run = run_pod(manifests, sts, 0, tmp_path, cont=_edited(cont, "--kv-transfer-config", json.dumps(kv)))
    _refused(run, "PreflightShapeMismatch", "--kv-transfer-config.kv_role")


def test_a_pod_on_the_wrong_ordinal_is_refused(tmp_path):
    # Pod 1 of a two-pod decode instance must run --headless with DP start rank 2; give it ordinal 0's
    # flags by dropping the prelude's per-pod steps.
    manifests = _manifests(MULTI_POD)
    sts = next(s for s in serving_sets(manifests) if s["spec"]["replicas"] > 1)
    cont = copy.deepcopy(container(sts))
    cont["command"] = cont["command"][cont["command"].index("pd-serve") + 1:]
    run = run_pod(manifests, sts, 1, tmp_path, cont=cont)
    _refused(run, "PreflightShapeMismatch", "--headless")


def test_too_few_npus_granted_is_refused(tmp_path):
    manifests = _manifests(GLM)
    sts = _decode(manifests)  # DP2 x TP4: 8 NPUs
    cont = copy.deepcopy(container(sts))
    for part in ("requests", "limits"):
        cont["resources"][part]["huawei.com/Ascend910"] = 4  # the device plugin then grants 4
    run = run_pod(manifests, sts, 0, tmp_path, cont=cont)
    _refused(run, "PreflightShapeMismatch", "resources")


def test_an_image_without_cross_tp_runs_is_refused(tmp_path):
    # The GLM example claims a seed image (seedChange: true); a stock release's source has no
    # _compute_cross_tp_runs, an old one no MooncakeConnectorV2, and an image may have no vllm-ascend.
    manifests = _manifests(GLM)
    sts = _decode(manifests)
    run = run_pod(manifests, sts, 0, tmp_path, vllm_ascend={"version": "0.30.0rc2", "seed": False})
    _refused(run, "PreflightImageMismatch", "spec.image.seedChange")
    run = run_pod(manifests, sts, 0, tmp_path / "old", vllm_ascend={"version": "0.23.0", "v2": False})
    _refused(run, "PreflightImageMismatch", "spec.kvTransfer.connector")
    run = run_pod(manifests, sts, 0, tmp_path / "none", vllm_ascend=None)
    _refused(run, "PreflightImageMismatch", "spec.image.name")


def test_a_missing_config_is_refused(tmp_path):
    manifests = _manifests(GLM)
    sts = _decode(manifests)
    image = image_of(manifests, container(sts))
    for config_map in (m for m in manifests if m["kind"] == "ConfigMap"):
        config_map["data"] = {}
    run = run_pod(manifests, sts, 0, tmp_path, image=image)
    assert run.returncode == EX_CONFIG and "PreflightConfigInvalid" in run.stderr and run.argv is None

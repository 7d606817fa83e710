"""`pdctl render FILE [-o yaml|json]`: manifests on stdout, exit 0; error findings with paths on
stderr, exit 1; unreadable input, exit 2."""

from __future__ import annotations

import json

import yaml

from pd_operator.cli import main
from support.renders import INCOMPATIBLE, VALID_EXAMPLES, rendered

GLM = next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-tp8-dp2tp4")


def test_yaml_output_is_the_render(capsys):
    assert main(["render", str(GLM)]) == 0
    assert list(yaml.safe_load_all(capsys.readouterr().out)) == rendered(GLM)


def test_json_output_is_a_list(capsys):
    assert main(["render", str(GLM), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "List" and out["items"] == rendered(GLM)


def test_incompatible_manifest_prints_findings_with_paths(capsys):
    assert main(["render", str(INCOMPATIBLE)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "HeadsNotDivisibleByTP at spec.decode.tensorParallelSize" in captured.err


def test_invalid_spec_is_findings_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load(GLM.read_text())
    doc["spec"]["decode"]["env"] = [{"name": "VLLM_HOST_IP", "value": "1.2.3.4"}]
    doc["spec"]["prefill"]["extraArgs"] = ["--block-size=64"]
    bad.write_text(yaml.safe_dump(doc))
    assert main(["render", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "EnvOverride at spec.decode.env[0]" in err
    assert "ArgOverride at spec.prefill.extraArgs[0]" in err
    assert "Traceback" not in err


def test_unreadable_input_exits_2(tmp_path, capsys):
    assert main(["render", str(tmp_path / "missing.yaml")]) == 2
    (tmp_path / "x.yaml").write_text("kind: [unclosed")
    assert main(["render", str(tmp_path / "x.yaml")]) == 2
    (tmp_path / "cm.yaml").write_text("kind: ConfigMap\n")
    assert main(["render", str(tmp_path / "cm.yaml")]) == 2
    assert "no PDDeployment" in capsys.readouterr().err


def test_config_map_model_cannot_be_rendered_offline(tmp_path, capsys):
    doc = yaml.safe_load(GLM.read_text())
    del doc["spec"]["model"]["preset"]
    doc["spec"]["model"]["hfConfigMap"] = {"name": "glm-config"}
    path = tmp_path / "cm-model.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", str(path)]) == 1
    assert "cannot render" in capsys.readouterr().err

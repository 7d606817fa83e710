"""Shared helpers of the renderer tests: the examples, their renders, and each pod's real argv.

`pod_argv` does not re-derive the per-pod flags: it runs the rendered container command with
/bin/sh, the pod's environment and a stand-in `vllm` that records its argv, so the shell prelude
that computes the DP start rank and the Mooncake config is exercised as written.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from pd_operator.render import mooncake, render
from pd_operator.validate import Validation, validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
INCOMPATIBLE = EXAMPLES / "incompatible-glm-tp8-tp3.yaml"
VALID_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("incompatible-"))
POD_IP = "10.1.2.3"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def validated(path: Path) -> Validation:
    return validate(load(path))


def rendered(path: Path) -> list[dict]:
    return render(validated(path))


def of_kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def serving_sets(manifests: list[dict]) -> list[dict]:
    return of_kind(manifests, "StatefulSet")


def container(workload: dict) -> dict:
    """The main container (vllm, proxy or metadata) of a workload; sidecars follow it."""
    return workload["spec"]["template"]["spec"]["containers"][0]


def role_of(obj: dict) -> str:
    return obj["metadata"]["labels"]["pd.serving.dev/role"]


def flag(argv: list[str], name: str) -> str | None:
    """The value after `name` in argv (None when absent)."""
    return argv[argv.index(name) + 1] if name in argv else None


def pod_env(cont: dict, ordinal: int) -> dict[str, str]:
    """The container's env as the kubelet would set it for pod `ordinal` (downward API resolved)."""
    fields = {"status.podIP": POD_IP,
              "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal)}
    out = {}
    for e in cont["env"]:
        out[e["name"]] = e["value"] if "value" in e else fields.get(e["valueFrom"].get("fieldRef", {})
                                                                     .get("fieldPath"), "from-secret")
    return out


def run_pod(cont: dict, ordinal: int, work: Path, template: str | None) -> tuple[list[str], dict | None]:
    """(argv `vllm` is exec'd with in pod `ordinal`, the Mooncake config file it wrote or None)."""
    command = list(cont["command"])
    if command[0] != "/bin/sh":
        return command, None
    fake = work / "bin" / "vllm"
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "open(os.environ['PD_TEST_ARGV'], 'w').write(json.dumps(sys.argv))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    # The ConfigMap template where the test keeps it instead of the pod's mount path.
    template_dir = work / "template"
    template_dir.mkdir()
    if template is not None:
        (template_dir / mooncake.CONFIG_KEY).write_text(template)
    command[2] = command[2].replace(mooncake.TEMPLATE_DIR, str(template_dir))
    env = {**pod_env(cont, ordinal), "PATH": f"{fake.parent}:/usr/bin:/bin",
           "PD_TEST_ARGV": str(work / "argv.json")}
    config = work / "mooncake.json"
    if "MOONCAKE_CONFIG_PATH" in env:
        env["MOONCAKE_CONFIG_PATH"] = str(config)
    subprocess.run(command, env=env, check=True, timeout=30)
    argv = json.loads((work / "argv.json").read_text())
    argv[0] = Path(argv[0]).name
    return argv, json.loads(config.read_text()) if config.exists() else None


def config_template(manifests: list[dict]) -> str | None:
    maps = of_kind(manifests, "ConfigMap")
    return maps[0]["data"][mooncake.CONFIG_KEY] if maps else None


def pod_argvs(manifests: list[dict], work: Path) -> list[tuple[dict, int, list[str], dict | None]]:
    """(StatefulSet, ordinal, argv, Mooncake config) of every serving pod of a render."""
    template = config_template(manifests)
    out = []
    for sts in serving_sets(manifests):
        for ordinal in range(sts["spec"]["replicas"]):
            where = work / f"{sts['metadata']['name']}-{ordinal}"
            argv, config = run_pod(container(sts), ordinal, where, template)
            out.append((sts, ordinal, argv, config))
    return out


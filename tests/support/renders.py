"""Shared helpers of the renderer tests: the examples, their renders, and each pod run for real.

`run_pod` does not re-derive anything: it lays out what a serving pod would see (the rendered
ConfigMap's files at their mount path, the container's env with the downward-API values filled in,
the NPUs the device plugin would grant for the container's resource limit, an installed
vllm-ascend source tree, which pd-preflight introspects) and runs the rendered container command in
its own network namespace, as in the image the container names by its model (support.image_model:
that image's commands alone on PATH, a python3 that imports only its packages; `vllm` a recorder of
its argv), with the tools bundle where the init container puts it. So `pd-preflight` and the shell
prelude that computes the DP start rank run exactly as written, with what the image has.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pd_operator.proxy.membership import KEY, Membership, parse_document
from pd_operator.render import render
from pd_operator.render.command import CONFIG_DIR
from pd_operator.render.runnable import validate
from pd_operator.serving_image import bundle
from pd_operator.serving_image.contents import DEFAULT_TOOLS_IMAGE, Contents, of_image
from pd_operator.spec.validate import Validation
from support import image_model
from support.specs import EXAMPLES, example, resolve
from support.vllm_ascend_tree import write_tree

INCOMPATIBLE = EXAMPLES / "incompatible-glm-tp8-tp3.yaml"
VALID_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("incompatible-"))
POD_IP = "10.1.2.3"


def validated(path: Path) -> Validation:
    return validate(example(path))


def rendered(path: Path) -> list[dict]:
    return render(resolve(example(path)))


def of_kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def serving_sets(manifests: list[dict]) -> list[dict]:
    return of_kind(manifests, "StatefulSet")


def serving_argv(sts: dict) -> list[str]:
    """The `vllm serve` argv after pd-preflight's `--` (and any shell prelude)."""
    command = container(sts)["command"]
    return command[command.index("--") + 1:]


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


# The vllm-ascend the pods see: a stand-in source tree on PYTHONPATH (support.vllm_ascend_tree), as
# the serving image has it installed; pd-preflight reads its source. By default it carries everything
# an example claims (MooncakeConnectorV2, the seed change, GLM-Next model code).
SEED_TREE: dict = {}
# A pod has its own network namespace; without one, ports of this shared machine would look busy.
# By absolute path: the pod's PATH is the image's.
UNSHARE = shutil.which("unshare")
NETNS = [UNSHARE, "-rn"] if UNSHARE and subprocess.run(
    [UNSHARE, "-rn", "true"], capture_output=True).returncode == 0 else []


def image_of(manifests: list[dict], cont: dict) -> Contents:
    """The model of the image a rendered container names (what the validator checked it against)."""
    image = json.loads(config_map_data(manifests)["pairing.json"])["spec"]["image"]
    found = of_image(cont["image"], tools_image=DEFAULT_TOOLS_IMAGE, serving_name=image["name"],
                     serving_version=image.get("vllmAscendVersion"),
                     serving_ours=bool(image.get("seedChange")))
    assert found is not None, f"no model of {cont['image']}"
    return found


@dataclass(frozen=True)
class PodRun:
    returncode: int
    stderr: str
    argv: list[str] | None
    """What the recorder `vllm` was exec'd with (None: it was not started)."""


def npu_count(cont: dict) -> int:
    """NPUs the device plugin grants: the container's extended-resource limit."""
    return sum(int(v) for k, v in cont["resources"].get("limits", {}).items() if "/" in k)


def config_map_data(manifests: list[dict], sts: dict | None = None) -> dict[str, str]:
    """The revision config `sts`'s pods mount at /etc/pd; without `sts`, every role's in one (their
    pairing.json is the same, their preflight configs have a key each)."""
    configs = [m for m in of_kind(manifests, "ConfigMap") if m.get("immutable")]
    assert {m["metadata"]["labels"]["pd.serving.dev/role"] for m in configs} == {"prefill", "decode"}
    if sts is not None:
        (name,) = [v["configMap"]["name"] for v in sts["spec"]["template"]["spec"]["volumes"]
                   if v["name"] == "pd-serving"]
        (config_map,) = [m for m in configs if m["metadata"]["name"] == name]
        return config_map["data"]
    return {k: v for m in configs for k, v in m["data"].items()}


def proxy_membership(manifests: list[dict]) -> Membership:
    """What the proxy routes to: the membership its ConfigMap holds."""
    (config_map,) = [m for m in of_kind(manifests, "ConfigMap")
                     if m["metadata"]["labels"].get("pd.serving.dev/role") == "proxy"]
    return parse_document(json.loads(config_map["data"][KEY]))


def run_pod(manifests: list[dict], sts: dict, ordinal: int, work: Path, *,
            cont: dict | None = None, npus: int | None = None,
            vllm_ascend: dict | None = SEED_TREE, bundled: bool = True,
            image: Contents | None = None) -> PodRun:
    """Run pod `ordinal` of `sts` (its main container, or `cont` edited from it) as in the image the
    container names, by its model (support.image_model: only the image's commands on PATH, only its
    packages importable), with a vllm-ascend laid out by `write_tree(**vllm_ascend)` (None: none
    installed) and, unless not `bundled`, the tools bundle where the init container puts it. `image`:
    the model to run as (default: that of the container's image, `image_of`)."""
    cont = cont or container(sts)
    work.mkdir(parents=True, exist_ok=True)
    mounted = work / "etc-pd"
    mounted.mkdir(exist_ok=True)
    for key, text in config_map_data(manifests, sts).items():
        (mounted / key).write_text(text)
    tools = work / "pd-tools"
    shutil.rmtree(tools, ignore_errors=True)
    tools.mkdir()
    if bundled:
        bundle.write(tools)
    bin_dir, site = image_model.lay_out(image or image_of(manifests, cont), work / "image")
    tree = work / "vllm-ascend"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir()
    if vllm_ascend is not None:
        write_tree(tree, **vllm_ascend)
    granted = npu_count(cont) if npus is None else npus
    argv_file = work / "argv.json"
    argv_file.unlink(missing_ok=True)
    env = {**pod_env(cont, ordinal), **image_model.path_env(bin_dir, site, tree),
           "PD_TEST_ARGV": str(argv_file), "ASCEND_VISIBLE_DEVICES": ",".join(str(i) for i in range(granted))}
    command = [arg.replace(CONFIG_DIR, str(mounted)).replace(bundle.MOUNT, str(tools))
               for arg in cont["command"]]
    done = subprocess.run([*NETNS, *command], env=env, capture_output=True, text=True, timeout=60)
    argv = json.loads(argv_file.read_text()) if argv_file.exists() else None
    if argv:
        argv[0] = Path(argv[0]).name
    return PodRun(done.returncode, done.stderr, argv)


def pod_argvs(manifests: list[dict], work: Path) -> list[tuple[dict, int, list[str]]]:
    """(StatefulSet, ordinal, argv) of every serving pod of a render; each pod's preflight must pass."""
    out = []
    for sts in serving_sets(manifests):
        for ordinal in range(sts["spec"]["replicas"]):
            run = run_pod(manifests, sts, ordinal, work / f"{sts['metadata']['name']}-{ordinal}")
            assert run.returncode == 0 and run.argv, \
                f"{sts['metadata']['name']} pod {ordinal}: the preflight refused: {run.stderr}"
            out.append((sts, ordinal, run.argv))
    return out

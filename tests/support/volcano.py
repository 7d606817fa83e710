"""Volcano's published PodGroup CRD at a pinned release, for the tests that validate rendered Volcano
PodGroups against it (server-side, installed into the test control plane, and offline).

    python -m support.volcano      # (PYTHONPATH=tests) fetch it into .cache/upstream and print the path

Volcano publishes the CRD in its repository, `config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml`
(volcano-sh/volcano @ v1.13.0), as controller-gen v0.18.0 writes it from the API types of
volcano.sh/apis v1.13.0 with the options of Volcano's `make manifests` (its Makefile: CRD_OPTIONS
"crd:crdVersions=v1,generateEmbeddedObjectMeta=true"). The Go module proxy serves volcano.sh/apis and
controller-tools at those versions but not volcano.sh/volcano, so this runs the same generator on the
same types and refuses the result unless its sha256 is the published file's (pinned below, read from
the v1.13.0 tag): what the tests use is byte for byte what Volcano ships. A build artefact under
.cache (ignored by git); nothing of it is committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PD_UPSTREAM_CACHE", ROOT / ".cache" / "upstream"))
VOLCANO = "v1.13.0"
APIS = f"volcano.sh/apis@{VOLCANO}"
CONTROLLER_GEN = "sigs.k8s.io/controller-tools/cmd/controller-gen@v0.18.0"
CRD_OPTIONS = "crd:crdVersions=v1,generateEmbeddedObjectMeta=true"
PODGROUPS = "scheduling.volcano.sh_podgroups.yaml"
# sha256 of config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml at volcano-sh/volcano v1.13.0.
PODGROUPS_SHA256 = "c30e6eea145258a207c310fdcf1cbcdfafc48031c74413e361381b2d19eee01f"


def _go(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    base = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", **(env or {})}
    done = subprocess.run(["go", *args], cwd=cwd, env=base, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"go {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def podgroup_crd() -> Path:
    """Volcano's PodGroup CRD (YAML), regenerated and checked against the published sha256."""
    out = CACHE / f"volcano-{VOLCANO}"
    crd = out / PODGROUPS
    if crd.is_file() and hashlib.sha256(crd.read_bytes()).hexdigest() == PODGROUPS_SHA256:
        return crd
    tools = CACHE / "bin"
    generator = tools / "controller-gen"
    if not generator.is_file():
        print(f"volcano: building {CONTROLLER_GEN} (once, about a minute)", file=sys.stderr, flush=True)
        _go("install", CONTROLLER_GEN, env={"GOBIN": str(tools)})
    apis = Path(json.loads(_go("mod", "download", "-json", APIS))["Dir"])
    # Run inside the module (read-only in the module cache): -mod=mod lets go/packages load its
    # dependencies from the module cache, as `go build` there would.
    subprocess.run([str(generator), CRD_OPTIONS, "paths=./pkg/apis/scheduling/v1beta1",
                    f"output:crd:artifacts:config={out}"], cwd=apis, check=True,
                   env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"})
    digest = hashlib.sha256(crd.read_bytes()).hexdigest()
    if digest != PODGROUPS_SHA256:
        raise RuntimeError(f"{crd}: sha256 {digest}, but Volcano {VOLCANO} publishes {PODGROUPS_SHA256}")
    return crd


if __name__ == "__main__":
    print(podgroup_crd())

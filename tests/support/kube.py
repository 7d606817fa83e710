"""kubectl and helm as users run them: the binaries `make tools` installs under .tools/."""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "kubectl" / "kubectl"
HELM = ROOT / ".tools" / "helm" / "helm"
CHART = ROOT / "charts" / "pd-operator"


def _run(binary: pathlib.Path, kubeconfig: pathlib.Path, args: Sequence[str], *, input: str | None,
         check: bool, timeout: float) -> subprocess.CompletedProcess[str]:
    if not binary.is_file():
        raise FileNotFoundError(f"{binary} is missing: run `make tools`")
    # Helm's caches beside the kubeconfig: nothing leaks into the user's home between runs.
    home = kubeconfig.parent
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": str(home / ".helm-cache"),
           "HELM_CONFIG_HOME": str(home / ".helm-config"), "HELM_DATA_HOME": str(home / ".helm-data")}
    result = subprocess.run([str(binary), *args], input=input, capture_output=True, text=True, env=env,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{binary.name} {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def kubectl(kubeconfig: pathlib.Path, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run kubectl with this kubeconfig; `check` raises with its output when it fails."""
    return _run(KUBECTL, kubeconfig, args, input=input, check=check, timeout=timeout)


def helm(kubeconfig: pathlib.Path, *args: str, check: bool = True,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return _run(HELM, kubeconfig, args, input=None, check=check, timeout=timeout)

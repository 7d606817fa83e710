"""Render the pd-operator chart with the real helm binary (`make tools` puts it in .tools/), with the
defaults and each value set under tests/chart/values/."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pd-operator"
VALUES_DIR = REPO / "tests" / "chart" / "values"
RELEASE = "pdo"
NAMESPACE = "pd-system"
# The default values plus every file under values/, by name.
VALUE_SETS = ["default", *sorted(p.stem for p in VALUES_DIR.glob("*.yaml"))]


# `make tools` unpacks helm v4 (the default) and helm v3 here; elsewhere a `helm` on PATH is v4.
LOCAL_HELM = {4: REPO / ".tools" / "helm" / "helm", 3: REPO / ".tools" / "helm3" / "helm" / "helm"}


def helm_binary(major: int = 4) -> str | None:
    local = LOCAL_HELM[major]
    if local.exists():
        return str(local)
    return shutil.which("helm") if major == 4 else None


@dataclass(frozen=True)
class HelmResult:
    returncode: int
    stdout: str
    stderr: str


def run_helm(*args: str, major: int = 4) -> HelmResult:
    helm = helm_binary(major)
    if helm is None:
        pytest.skip(f"helm v{major} not found: run `make tools` (fetches helm v4 and v3 into .tools/)")
    done = subprocess.run([helm, *args], capture_output=True, text=True, timeout=60)
    return HelmResult(done.returncode, done.stdout, done.stderr)


GENERATED_KEY = re.compile(r"(?m)^(  key: )[A-Za-z0-9+/=]{40,}$")
"""The proxy-admin Secret's key, random at every render that cannot look up the installed one."""


def stable(text: str) -> str:
    """`helm template` output with the generated key masked, so two renders compare equal."""
    return GENERATED_KEY.sub(r"\1<generated>", text)


def values_args(value_set: str) -> list[str]:
    return [] if value_set == "default" else ["-f", str(VALUES_DIR / f"{value_set}.yaml")]


def template(*extra: str, major: int = 4) -> HelmResult:
    return run_helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--include-crds", *extra, major=major)


@cache
def _rendered(value_set: str) -> tuple[dict, ...]:
    result = template(*values_args(value_set))
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def rendered(value_set: str) -> list[dict]:
    """The manifests `helm template --include-crds` makes for a value set (cached per session)."""
    return list(_rendered(value_set))


def find(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
    return [
        d for d in docs
        if d["kind"] == kind
        and (name is None or d["metadata"]["name"] == name)
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]


def one(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> dict:
    found = find(docs, kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def operator_deployment(docs: list[dict]) -> dict:
    return one(docs, "Deployment", f"{RELEASE}-pd-operator", NAMESPACE)


def template_with(*settings: str) -> list[dict]:
    """The manifests `helm template` makes with these `--set` settings (it must succeed)."""
    result = template(*[arg for s in settings for arg in ("--set", s)])
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def operator_args(*settings: str) -> list[str]:
    """The operator's command-line arguments the chart renders with these `--set` settings."""
    return list(operator_container(template_with(*settings))["args"])


def operator_container(docs: list[dict]) -> dict:
    (container,) = operator_deployment(docs)["spec"]["template"]["spec"]["containers"]
    return container


def notes(value_set: str) -> str:
    """NOTES.txt as `helm install` prints it (a client-side dry run needs no cluster)."""
    dry_run = ("install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client")
    result = run_helm(*dry_run, *values_args(value_set))
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:\n", 1)[1]

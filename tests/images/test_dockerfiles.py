"""Static checks of the two images (no docker engine here): every COPY source exists in the build
context (the repository root), every base image and every pip install is pinned, the operator image
runs as non-root with only the operator's runtime dependencies, and the serving image's tag matches
the vllm-ascend floor pd-preflight enforces."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pd_operator.preflight import CROSS_TP_MIN_VERSION, version_key

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {name: ROOT / "images" / name / "Dockerfile" for name in ("operator", "vllm-ascend")}
PINNED_TAG = re.compile(r"^v?\d+\.\d+\.\d+")  # a full version, not a floating `3.11` or `latest`
PINNED_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!-]+$")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, rest = (pending + stripped).partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def args_of(rest: str) -> list[str]:
    return json.loads(rest) if rest.startswith("[") else shlex.split(rest)


def copies(path: Path) -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD from the build context."""
    out = []
    for keyword, rest in instructions(path):
        if keyword not in ("COPY", "ADD"):
            continue
        words = args_of(rest)
        assert not any(w.startswith("--from") for w in words), "multi-stage copies are not used"
        words = [w for w in words if not w.startswith("--")]
        out.append((words[:-1], words[-1]))
    return out


def pip_requirements(path: Path) -> list[str]:
    """Every argument of every `pip install` that is not an option."""
    reqs = []
    for keyword, rest in instructions(path):
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;|\|\|", rest):
            words = shlex.split(command)
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":
                    options = set(words[i + 2:])
                    assert not {"-r", "-c", "--requirement", "--constraint", "-e"} & options, command
                    reqs += [w for w in words[i + 2:] if not w.startswith("-")]
    return reqs


@pytest.mark.parametrize("image", list(IMAGES))
def test_every_copy_source_exists_in_the_build_context(image):
    found = copies(IMAGES[image])
    assert found
    for sources, _ in found:
        for source in sources:
            assert (ROOT / source).exists(), f"{image}: COPY source {source} does not exist"


@pytest.mark.parametrize("image", list(IMAGES))
def test_every_base_image_is_pinned_by_version(image):
    bases = [args_of(rest)[0] for keyword, rest in instructions(IMAGES[image]) if keyword == "FROM"]
    assert bases
    for base in bases:
        assert "$" not in base, f"{image}: FROM {base} is set by a build argument"
        name, _, tag = base.partition("@")[0].rpartition(":")
        assert name and "/" not in tag, f"{image}: FROM {base} has no tag"
        assert tag != "latest" and PINNED_TAG.match(tag), f"{image}: FROM {base} is a floating tag"


@pytest.mark.parametrize("image", list(IMAGES))
def test_every_pip_install_is_pinned(image):
    reqs = pip_requirements(IMAGES[image])
    assert reqs
    destinations = [dest.rstrip("/") for _, dest in copies(IMAGES[image])]
    for req in reqs:
        if req.startswith("/"):
            # A local path is pinned by the COPY that put it there.
            assert any(req == d or req.startswith(d + "/") or d.startswith(req + "/")
                       for d in destinations), req
        else:
            assert PINNED_REQUIREMENT.match(req), f"{image}: pip install {req} is not pinned with =="


def test_operator_image_installs_exactly_the_operators_runtime_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["operator"]]
    pinned = {canonicalize_name(Requirement(r).name): Requirement(r)
              for r in pip_requirements(IMAGES["operator"]) if not r.startswith("/")}
    assert set(pinned) == {canonicalize_name(r.name) for r in wanted}
    for req in wanted:
        (version,) = (s.version for s in pinned[canonicalize_name(req.name)].specifier)
        assert req.specifier.contains(version), f"{req.name}=={version} violates pyproject's {req.specifier}"


# Base dependencies the serving image gets from vLLM itself (vllm's own requirements).
FROM_VLLM = {"pydantic", "pyyaml", "numpy"}


def test_serving_image_adds_the_base_dependencies_vllm_lacks():
    base = {canonicalize_name(Requirement(r).name)
            for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    pinned = {canonicalize_name(Requirement(r).name)
              for r in pip_requirements(IMAGES["vllm-ascend"]) if not r.startswith("/")}
    assert pinned == base - FROM_VLLM


def test_operator_image_runs_as_non_root():
    users = [rest for keyword, rest in instructions(IMAGES["operator"]) if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entry = [args_of(rest) for keyword, rest in instructions(IMAGES["operator"]) if keyword == "ENTRYPOINT"]
    assert entry[-1] == ["pd-operator"]
    assert "pd-operator" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_serving_image_tag_is_the_cross_tp_floor_and_installs_the_pod_commands():
    (base,) = [args_of(rest)[0] for keyword, rest in instructions(IMAGES["vllm-ascend"]) if keyword == "FROM"]
    name, tag = base.rsplit(":", 1)
    assert name == "quay.io/ascend/vllm-ascend"
    assert version_key(tag) == version_key(CROSS_TP_MIN_VERSION)
    # The rendered pods run these console scripts; the package install puts them on PATH.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"pd-preflight", "pd-kv-probe"} <= set(scripts)
    assert "/opt/pd-operator" in pip_requirements(IMAGES["vllm-ascend"])
    env = " ".join(rest for keyword, rest in instructions(IMAGES["vllm-ascend"]) if keyword == "ENV")
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in env

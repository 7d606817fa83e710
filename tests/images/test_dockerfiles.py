"""Static checks of the two images (the `images` tier builds and runs them: test_operator_image.py):
every COPY source exists in the build context (the repository root), every base image (a build
argument's default included) and every pip install is pinned, the host's CA bundle reaches pip only as
a build secret, the operator image's final stage runs as non-root with only the operator's runtime
dependencies, and the serving image is a known vllm-ascend release rebuilt from the seed change's ref,
checked at build time and recorded, with the console scripts the rendered pods run."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pd_operator.serving_image.capabilities import RELEASES, SEED_PULL_REQUEST, release_of_tag
from pd_operator.serving_image.installed import COMMIT_FILE
from support.vllm_ascend_tree import write_tree

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {name: ROOT / "images" / name / "Dockerfile" for name in ("operator", "vllm-ascend")}
PINNED_TAG = re.compile(r"^v?\d+\.\d+\.\d+")  # a full version, not a floating `3.11` or `latest`
PINNED_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!-]+$")
# The serving image's vllm-ascend checkout: fetched by VLLM_ASCEND_COMMIT (its hash) and checked in the
# same RUN, so it is pinned by commit rather than by a COPY.
FETCHED_CHECKOUT = "/vllm-workspace/vllm-ascend"


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


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (a FROM starts one; global ARGs before it are dropped)."""
    out: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions(path):
        if keyword == "FROM":
            out.append([])
        if out:
            out[-1].append((keyword, rest))
    return out


def copies(path: Path) -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD from the build context; a copy from an earlier stage
    (`--from=NAME`) must name one."""
    out = []
    named: set[str] = set()
    for stage in stages(path):
        for keyword, rest in stage:
            words = args_of(rest)
            if keyword == "FROM" and len(words) == 3 and words[1].upper() == "AS":
                named.add(words[2])
            if keyword not in ("COPY", "ADD"):
                continue
            origin = [w.partition("=")[2] for w in words if w.startswith("--from=")]
            assert all(o in named for o in origin), f"{path}: COPY --from={origin} names no earlier stage"
            if not origin:
                words = [w for w in words if not w.startswith("--")]
                out.append((words[:-1], words[-1]))
    return out


# Options of `pip install` that take a value.
VALUED_OPTIONS = {"--extra-index-url", "--index-url", "-i", "--only-binary", "--no-binary", "-r",
                  "--requirement", "-c", "--constraint", "--find-links", "-f"}
PYPI = "https://pypi.org/simple"


def pip_installs(path: Path) -> list[list[str]]:
    """The words after `pip install` of every pip install the Dockerfile runs."""
    out = []
    for keyword, rest in instructions(path):
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;|\|\|", rest):
            words = shlex.split(command)
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":
                    out.append(words[i + 2:])
    return out


def option_values(words: list[str], *names: str) -> list[str]:
    return [words[j + 1] for j in range(len(words) - 1) if words[j] in names]


def pip_requirements_of(words: list[str]) -> list[str]:
    """The arguments of one `pip install` that are neither an option nor an option's value."""
    values = {words[j + 1] for j in range(len(words) - 1) if words[j] in VALUED_OPTIONS}
    return [w for w in words if not w.startswith("-") and w not in values]


def pip_requirements(path: Path) -> list[str]:
    """Every argument of every `pip install` that is neither an option nor an option's value."""
    return [w for words in pip_installs(path) for w in pip_requirements_of(words)]


def lock_files(path: Path) -> list[Path]:
    """The requirement files its pip installs read (`-r`), as the repository has them: each is COPY'd
    from the repository, so the path in the image maps back by its file name."""
    copied = {Path(dest.rstrip("/")) / Path(src).name if dest.endswith("/") else Path(dest): ROOT / src
              for sources, dest in copies(path) for src in sources}
    return [copied[Path(name)] for words in pip_installs(path)
            for name in option_values(words, "-r", "--requirement")]


def locked(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of every requirement of a pip-compile --generate-hashes file."""
    out: dict[str, tuple[str, list[str]]] = {}
    for entry in re.split(r"\n(?=\S)", lock.read_text()):
        line = entry.split("#", 1)[0].replace("\\\n", " ").strip()
        if not line or line.startswith("-"):
            continue
        words = line.split()
        req = Requirement(words[0])
        (version,) = (spec.version for spec in req.specifier if spec.operator == "==")
        out[canonicalize_name(req.name)] = (version, [w.removeprefix("--hash=") for w in words[1:]])
    return out


@pytest.mark.parametrize("image", list(IMAGES))
def test_every_copy_source_exists_in_the_build_context(image):
    found = copies(IMAGES[image])
    assert found
    for sources, _ in found:
        for source in sources:
            assert (ROOT / source).exists(), f"{image}: COPY source {source} does not exist"


def global_args(path: Path) -> dict[str, str]:
    """The build arguments declared before the first FROM (the only ones a FROM line can use)."""
    out = {}
    for keyword, rest in instructions(path):
        if keyword == "FROM":
            break
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            out[name] = default.strip('"')
    return out


DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@pytest.mark.parametrize("image", list(IMAGES))
def test_every_base_image_is_pinned_by_digest(image):
    """A tag can be pushed again, a digest cannot. A base set by a build argument is pinned by the
    argument's default (the images tier passes the local base by its digest); the serving image's
    digest has no default: build.sh requires it (test_build_script_takes_a_reviewed_commit_and_digest)."""
    args = global_args(IMAGES[image])
    names: set[str] = set()
    bases = []
    for stage in stages(IMAGES[image]):
        words = args_of(stage[0][1])
        if words[0] not in names:  # FROM an earlier stage is pinned by that stage's FROM
            bases.append(words[0])
        if len(words) == 3:
            names.add(words[2])
    assert bases
    for written in bases:
        base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], written)
        reference, _, digest = base.partition("@")
        name, _, tag = reference.rpartition(":")
        assert name and "/" not in tag, f"{image}: FROM {base} has no tag"
        assert tag != "latest" and PINNED_TAG.match(tag), f"{image}: FROM {base} is a floating tag"
        if image == "vllm-ascend":
            assert written.endswith("@${VLLM_ASCEND_BASE_DIGEST}") and digest == "", written
        else:
            assert DIGEST.match(digest), f"{image}: FROM {base} is not pinned by digest"


@pytest.mark.parametrize("image", list(IMAGES))
def test_every_pip_install_is_pinned_and_from_pypi_alone(image):
    """Each pip install takes PyPI alone (or no index), and each requirement is pinned: by ==, by
    the COPY of a local path, or by hash in a lock file (--require-hashes)."""
    installs = pip_installs(IMAGES[image])
    assert installs
    for words in installs:
        assert not option_values(words, "--extra-index-url", "--find-links", "-f"), words
        assert option_values(words, "--index-url", "-i") == [PYPI] or "--no-index" in words, words
        if option_values(words, "-r", "--requirement"):
            assert "--require-hashes" in words and "--only-binary" in words, words
        if "--no-index" not in words:
            # From the index only what a lock names, each file checked against its hashes: a name
            # given here would be fetched unhashed, with whatever it depends on.
            assert "--require-hashes" in words and "--no-deps" in words, words
            assert not [w for w in pip_requirements_of(words) if not w.startswith("/")], words
    text = IMAGES[image].read_text()
    assert "PIP_EXTRA_INDEX_URL" not in text and "PIP_INDEX_URL" not in text
    reqs = pip_requirements(IMAGES[image])
    destinations = [dest.rstrip("/") for _, dest in copies(IMAGES[image])]
    for req in reqs:
        if req == FETCHED_CHECKOUT and image == "vllm-ascend":
            continue  # pinned by commit: test_serving_image_builds_vllm_ascend_from_a_reviewed_commit
        if req.startswith("/"):
            # A local path is pinned by the COPY that put it there.
            assert any(req == d or req.startswith(d + "/") or d.startswith(req + "/")
                       for d in destinations), req
        else:
            assert PINNED_REQUIREMENT.match(req), f"{image}: pip install {req} is not pinned with =="
    for lock in lock_files(IMAGES[image]):
        entries = locked(lock)
        assert entries, lock
        for name, (version, hashes) in entries.items():
            assert hashes and all(DIGEST.match(h) for h in hashes), f"{lock.name}: {name}=={version} unhashed"


def test_operator_image_installs_exactly_the_operators_runtime_dependencies():
    """requirements.in pins pyproject's runtime dependencies (base, and the `operator` and `proxy`
    extras: pd-proxy runs from this image), and its lock pins each at that version, with every
    transitive dependency; build.in what builds the wheel."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [Requirement(r) for r in project["dependencies"] + extras["operator"] + extras["proxy"]]
    pinned = {canonicalize_name((req := Requirement(line)).name): req
              for line in (ROOT / "images/operator/requirements.in").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert set(pinned) == {canonicalize_name(r.name) for r in wanted}
    runtime, build = (locked(ROOT / f"images/operator/{name}.lock") for name in ("requirements", "build"))
    for req in wanted:
        (version,) = (s.version for s in pinned[canonicalize_name(req.name)].specifier)
        assert req.specifier.contains(version), f"{req.name}=={version} violates pyproject's {req.specifier}"
        assert runtime[canonicalize_name(req.name)][0] == version, \
            f"{req.name}: the lock is stale (images/lock.sh)"
    assert {"setuptools", "wheel"} <= set(build) and not {"setuptools", "wheel", "pip"} & set(runtime)
    assert sorted(lock_files(IMAGES["operator"])) == sorted(
        ROOT / f"images/operator/{name}.lock" for name in ("requirements", "build"))


# Base dependencies the serving image gets from vLLM itself (vllm's own requirements).
FROM_VLLM = {"pydantic", "pyyaml", "numpy"}
# ... and pd-proxy's (the `proxy` extra): vLLM's OpenAI server needs aiohttp, its KV events msgspec and pyzmq.
PROXY_FROM_VLLM = {"aiohttp", "msgspec", "pyzmq"}


SERVING_LOCKS = ROOT / "images/vllm-ascend"
BASE_LACKS = SERVING_LOCKS / "base_lacks.py"


def test_serving_image_adds_the_base_dependencies_vllm_lacks_hash_locked():
    """requirements.in pins pyproject's base dependencies vLLM lacks, its lock pins each at that version
    with every transitive dependency and its hashes, and the one install from an index reads that lock
    (--require-hashes, --no-deps), pruned first to what the base lacks and checked after."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {canonicalize_name((req := Requirement(r)).name): req for r in project["dependencies"]}
    pinned = {canonicalize_name((req := Requirement(line)).name): req
              for line in (SERVING_LOCKS / "requirements.in").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert set(pinned) == set(wanted) - FROM_VLLM
    lock = locked(SERVING_LOCKS / "requirements.lock")
    for name, req in pinned.items():
        (version,) = (s.version for s in req.specifier if s.operator == "==")
        assert wanted[name].specifier.contains(version), f"{name}=={version} violates pyproject's"
        assert lock[name][0] == version, f"{name}: the lock is stale (images/lock.sh)"
    assert lock_files(IMAGES["vllm-ascend"]) == [SERVING_LOCKS / "requirements.lock"]
    (step,) = [" ".join(r.split()) for r in serving_run_steps() if "-r /locks/requirements.lock" in r]
    order = [step.index(part) for part in (
        "python3 /locks/base_lacks.py prune /locks/requirements.lock /locks/requirements.in",
        "--require-hashes --no-deps -r /locks/requirements.lock",
        "python3 /locks/base_lacks.py check /locks/requirements.lock")]
    assert order == sorted(order), "prune to what the base lacks, install hash-checked, check"
    assert (BASE_LACKS.name, "/locks/") in [(Path(src).name, dest) for sources, dest in
                                            copies(IMAGES["vllm-ascend"]) for src in sources]


def fake_site(root: Path, dists: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
    """A Python environment holding exactly `dists` (name -> (version, Requires-Dist)) and pip's code
    (the pip that runs the step; no distribution of it): base_lacks.py's view of an image."""
    import pip

    root.mkdir()
    (root / "pip").symlink_to(Path(pip.__file__).parent)
    for name, (version, requires) in dists.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("".join(
            [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"]
            + [f"Requires-Dist: {r}\n" for r in requires]))
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}


def base_lacks(env: dict[str, str], *args: object) -> subprocess.CompletedProcess:
    # -S: no site-packages, so the fake site is all the script sees (as the base's Python sees its own).
    return subprocess.run([sys.executable, "-S", str(BASE_LACKS), *map(str, args)], capture_output=True,
                          text=True, timeout=60, env=env)


def test_base_lacks_installs_only_what_the_base_lacks_and_checks_the_rest(tmp_path):
    """prune keeps, verbatim with their hashes, the lock's entries requirements.in pins (a base's older
    jsonschema is replaced) and those the base lacks; pyyaml and attrs, which the base has, stay the
    base's. check fails, naming both sides, when a copy the base kept is too old for what was added."""
    lock = tmp_path / "requirements.lock"
    lock.write_text((SERVING_LOCKS / "requirements.lock").read_text())
    full = locked(lock)
    base = {"pyyaml": ("6.0.2", []), "attrs": ("25.3.0", []), "jsonschema": ("4.23.0", [])}
    env = fake_site(tmp_path / "base", base)
    done = base_lacks(env, "prune", lock, SERVING_LOCKS / "requirements.in")
    assert done.returncode == 0, done.stderr
    kept = locked(lock)
    assert set(kept) == set(full) - {"pyyaml", "attrs"}
    assert kept == {name: full[name] for name in kept}, "entries are kept with all their hashes"
    assert {"cel-python", "jsonschema", "lark", "referencing"} <= set(kept)

    # What the image holds once pip installed the pruned lock: each kept entry at its locked version.
    real = {name: (version, list(distribution(name).requires or [])) for name, (version, _) in kept.items()}
    image = {**base, **real}
    assert base_lacks(fake_site(tmp_path / "image", image), "check", lock).returncode == 0
    too_old = {**image, "pyyaml": ("5.4.1", [])}
    done = base_lacks(fake_site(tmp_path / "old", too_old), "check", lock)
    assert done.returncode == 1
    assert "cel-python needs pyyaml>=6.0.2; the image has pyyaml 5.4.1" in done.stderr
    assert "images/vllm-ascend/requirements.in" in done.stderr


def test_operator_image_runs_as_non_root():
    final = stages(IMAGES["operator"])[-1]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entry = [args_of(rest) for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert entry[-1] == ["pd-operator"]
    assert "pd-operator" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_operator_image_final_stage_has_no_build_tools():
    """Only the build stage's venv reaches the final stage, after pip, setuptools and wheel left it; the
    final stage removes the base image's own (and the copies ensurepip keeps) and installs nothing."""
    build, final = stages(IMAGES["operator"])
    final_runs = [rest for keyword, rest in final if keyword == "RUN"]
    assert not [run for run in final_runs if "pip install" in run]
    assert any("python3 -m pip uninstall -y -q pip setuptools wheel" in run
               and "ensurepip" in run and "/usr/share/python-wheels" in run for run in final_runs)
    # That RUN comes before PATH names the venv, so `python3` is the base image's.
    uninstall = next(i for i, (k, rest) in enumerate(final) if k == "RUN" and "pip uninstall" in rest)
    path_set = next(i for i, (k, rest) in enumerate(final) if k == "ENV" and "PATH=" in rest)
    assert uninstall < path_set
    assert [args_of(rest) for keyword, rest in final if keyword == "COPY"] == [
        ["--from=build", "/opt/pd-operator", "/opt/pd-operator"]]
    assert any("pip uninstall -y -q pip setuptools wheel" in rest for k, rest in build if k == "RUN")
    env = " ".join(rest for keyword, rest in final if keyword == "ENV")
    assert "PATH=/opt/pd-operator/bin:" in env and "PYTHONDONTWRITEBYTECODE=1" in env


@pytest.mark.parametrize("image", list(IMAGES))
def test_the_hosts_ca_bundle_never_lands_in_a_layer(image):
    """PyPI's TLS may need the build host's CA bundle: only a RUN's secret mount may bring it."""
    for keyword, rest in instructions(IMAGES[image]):
        mentions = any(word in rest for word in ("PIP_CERT", "cacert", "ca-certificates.crt"))
        assert not mentions or (keyword == "RUN" and "--mount=type=secret,id=cacert" in rest), (keyword, rest)
    if image == "operator":  # the images tier builds it where PyPI needs the host's CA
        for keyword, rest in instructions(IMAGES[image]):
            if keyword == "RUN" and "pip install" in rest and "--no-index" not in rest:
                assert rest.startswith("--mount=type=secret,id=cacert "), rest
                assert "export PIP_CERT=/run/secrets/cacert" in rest, rest


def build_args(path: Path) -> dict[str, str]:
    out = {}
    for keyword, rest in instructions(path):
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            out[name] = default.strip('"')
    return out


def serving_run_steps() -> list[str]:
    return [rest for keyword, rest in instructions(IMAGES["vllm-ascend"]) if keyword == "RUN"]


def test_serving_image_is_a_known_vllm_ascend_release_and_installs_the_pod_commands():
    (written,) = [args_of(rest)[0] for keyword, rest in instructions(IMAGES["vllm-ascend"])
                  if keyword == "FROM"]
    base = written.replace("${VLLM_ASCEND_BASE}", global_args(IMAGES["vllm-ascend"])["VLLM_ASCEND_BASE"])
    base = base.removesuffix("@${VLLM_ASCEND_BASE_DIGEST}")
    assert base.startswith("quay.io/ascend/vllm-ascend:v")
    assert release_of_tag(base) == list(RELEASES)[-1], "the base is the newest release the operator knows"
    steps = instructions(IMAGES["vllm-ascend"])
    # The rendered container command (pd-preflight ... -- vllm serve) replaces any ENTRYPOINT; the
    # package install puts the console scripts the pods run on PATH.
    assert not [rest for keyword, rest in steps if keyword == "ENTRYPOINT"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"pd-preflight", "pd-kv-probe", "pd-proxy"} <= set(project["scripts"])
    assert "/opt/pd-operator" in pip_requirements(IMAGES["vllm-ascend"])
    # The package's `proxy` extra comes with vLLM, and the build runs pd-proxy once (importing the
    # package and aiohttp) right after the package is installed. The pods do not run it from here.
    assert {canonicalize_name(Requirement(r).name)
            for r in project["optional-dependencies"]["proxy"]} == PROXY_FROM_VLLM
    (install,) = [r for r in serving_run_steps() if "/opt/pd-operator" in r and "VLLM_ASCEND_COMMIT" not in r]
    assert install.index("--no-deps /opt/pd-operator") < install.index("pd-proxy --help")
    env = " ".join(rest for keyword, rest in steps if keyword == "ENV")
    assert "VLLM_USE_V2_MODEL_RUNNER" not in env, "the runner is rendered per model, not fixed in the image"


def test_serving_image_builds_vllm_ascend_from_a_reviewed_commit():
    """No moving ref at build time: the commit is a required argument, fetched by its hash; vllm-ascend
    is built with no index (nothing resolved from one) and no extra index anywhere."""
    args = build_args(IMAGES["vllm-ascend"])
    assert "VLLM_ASCEND_REF" not in args
    assert args["VLLM_ASCEND_REPO"] == "https://github.com/vllm-project/vllm-ascend.git"
    assert args["VLLM_ASCEND_COMMIT"] == "", "no commit is written down: whoever builds names a reviewed one"
    (build,) = [r for r in serving_run_steps() if "VLLM_ASCEND_COMMIT" in r]
    order = [build.index(step) for step in (
        "printf '%s' \"${VLLM_ASCEND_COMMIT}\" | grep -Eqx '[0-9a-f]{40}'",
        'git fetch -q --depth 1 "${VLLM_ASCEND_REPO}" "${VLLM_ASCEND_COMMIT}"',
        '[ "${fetched}" = "${VLLM_ASCEND_COMMIT}" ]',
        f"python3 -m pd_operator.serving_image.installed {FETCHED_CHECKOUT} --require-seed",
        f"pip install --no-cache-dir --no-index --no-deps --no-build-isolation -e {FETCHED_CHECKOUT}",
        "python3 -m pd_operator.serving_image.installed --installed --require-seed",
        f'echo "${{VLLM_ASCEND_COMMIT}}" > {COMMIT_FILE}')]
    assert order == sorted(order), "check the form, fetch by hash, verify, check the seed, build, check again"
    assert "extra-index-url" not in IMAGES["vllm-ascend"].read_text()
    (install,) = [r for r in serving_run_steps() if "/opt/pd-operator" in r and "VLLM_ASCEND_COMMIT" not in r]
    assert "--no-deps /opt/pd-operator" in install, \
        "the package (and its serving_image.installed) is installed before the build runs it"
    labels = " ".join(rest for keyword, rest in instructions(IMAGES["vllm-ascend"]) if keyword == "LABEL")
    assert 'dev.pd-serving.vllm-ascend.commit="${VLLM_ASCEND_COMMIT}"' in labels


BUILD_SCRIPT = ROOT / "images/vllm-ascend/build.sh"


def test_build_script_takes_a_reviewed_commit_and_digest(tmp_path):
    """build.sh resolves nothing (no `git ls-remote` of a moving ref, no registry lookup): it refuses
    to start without a commit and a digest of the right form, before any build."""
    script = BUILD_SCRIPT.read_text()
    commands = [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert not [line for line in commands if "ls-remote" in line or "skopeo" in line or "inspect" in line]
    assert '--build-arg VLLM_ASCEND_COMMIT="$commit"' in script
    assert '--build-arg VLLM_ASCEND_BASE_DIGEST="$digest"' in script
    assert f"refs/pull/{SEED_PULL_REQUEST}/head" in script, "it says which head to review"
    # `docker` must never run for a refused argument: a stub on PATH records any call.
    (tmp_path / "docker").write_text(f"#!/bin/sh\ntouch {tmp_path}/called\n")
    (tmp_path / "docker").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    commit, digest = "0" * 40, "sha256:" + "a" * 64
    for args, complaint in ((["img"], "COMMIT"), (["img", "refs/pull/16755/head", digest], "40 hex digits"),
                            (["img", commit], "BASE_DIGEST"), (["img", commit, "v0.30.0rc2"], "sha256:")):
        done = subprocess.run(["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, env=env)
        assert done.returncode != 0 and complaint in done.stderr, (args, done.stderr)
    assert not (tmp_path / "called").exists()
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "img", commit, digest], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0 and (tmp_path / "called").exists(), done.stderr


def image_check(root: Path) -> subprocess.CompletedProcess:
    """The build-time check exactly as the Dockerfile runs it, on a stand-in source tree."""
    return subprocess.run([sys.executable, "-m", "pd_operator.serving_image.installed", str(root),
                           "--require-seed"],
                          capture_output=True, text=True, timeout=60)


def test_build_time_check_fails_without_the_seed_functions_and_passes_with_them(tmp_path):
    without = image_check(write_tree(tmp_path / "release", version="0.30.0rc2", seed=False))
    assert without.returncode == 1
    assert "no _compute_cross_tp_runs in MooncakeConnectorV2's package" in without.stderr
    assert "seed change no" in without.stdout
    no_connector = image_check(write_tree(tmp_path / "old", version="0.23.0", v2=False))
    assert no_connector.returncode == 1 and "MooncakeConnectorV2 is not registered" in no_connector.stderr
    with_seed = image_check(write_tree(tmp_path / "seed"))
    assert with_seed.returncode == 0, with_seed.stderr
    assert "vllm-ascend 0.30.0rc3.dev1 (g0123abc)" in with_seed.stdout
    assert "seed change yes" in with_seed.stdout


def test_build_time_check_of_the_installed_vllm_ascend(tmp_path):
    """`--installed` reads the vllm_ascend Python would import (after the image's pip install)."""
    def installed(path: Path | None) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(
            str(p) for p in (path, ROOT / "operator") if p)}
        command = [sys.executable, "-m", "pd_operator.serving_image.installed", "--installed",
                   "--require-seed"]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    seed = write_tree(tmp_path / "seed")
    done = installed(seed)
    assert done.returncode == 0 and f"at {seed}:" in done.stdout, done.stderr
    assert installed(write_tree(tmp_path / "release", seed=False)).returncode == 1
    nothing = installed(None)
    assert nothing.returncode == 1 and "no vllm_ascend package is importable" in nothing.stderr

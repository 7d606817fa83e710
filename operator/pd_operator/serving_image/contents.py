"""What each image a rendered container names contains, as data, and the check that every rendered
container's command can run in its image (spec/validate.py runs it on the render of every spec).

Three kinds of image appear in what the operator renders:
- a vllm-ascend release image (quay.io/ascend/vllm-ascend:v<version>[-a3|...]): python3 (the
  release's, `Release.python`), `vllm`, vLLM's own requirements (pydantic, numpy, pyyaml, aiohttp:
  vllm: requirements/common.txt @ v0.34.0), vllm_ascend and the Mooncake NPU wheel (vllm-ascend:
  Dockerfile @ v0.30.0rc2). Nothing of ours.
- an image built from images/vllm-ascend (spec.image.seedChange): a release plus the seed change and
  this package with its console scripts. The rendered pods rely on none of it: they run the tools
  bundle (serving_image/bundle.py), so a pod starts alike on both.
- the operator image (images/operator), also the tools image: python3 3.11 with this package, the
  operator extra and its console scripts (`pd-proxy`, `pd-bundle`, ...). It runs the proxy and the
  init container that copies the bundle into serving pods.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pd_operator import __version__
from pd_operator.findings import Finding
from pd_operator.serving_image import bundle
from pd_operator.serving_image.capabilities import RELEASES, release_of_tag

DEFAULT_TOOLS_IMAGE = f"ghcr.io/pd-serving/pd-operator:{__version__}"
"""The operator image as the chart's defaults name it (values.yaml image.repository, the chart's
appVersion): the tools image when `pd-operator run` or `pdctl render` is given no --tools-image."""
TOOLS_IMAGE_FLAG = "--tools-image"
"""The operator's flag (and pdctl's) naming the tools image: the field findings about it point at."""
OPERATOR_REPOSITORY = "pd-operator"


@dataclass(frozen=True)
class Contents:
    """What a container of this image can run."""

    kind: str
    """What the image is, for messages."""
    python: tuple[int, int]
    """The version of its python3."""
    commands: frozenset[str]
    """Executables on its PATH."""
    modules: frozenset[str]
    """Top-level packages its python3 imports (the standard library's aside)."""


SHELL = frozenset({"sh", "python3"})
"""Every image here is a Debian or Ubuntu one with python3."""
VLLM_REQUIREMENTS = frozenset({"pydantic", "numpy", "yaml", "aiohttp"})
"""What `import` finds of vLLM's requirements that this package also uses (pyyaml imports as yaml)."""
OUR_SCRIPTS = frozenset({"pdctl", "pd-operator", "pd-kv-probe", "pd-preflight", "pd-proxy", bundle.COMMAND})
"""pyproject.toml [project.scripts] (tests/serving_image check they agree)."""
OPERATOR = Contents(
    "the pd-operator image", (3, 11), SHELL | OUR_SCRIPTS,
    VLLM_REQUIREMENTS | {"pd_operator", "kopf", "kubernetes", "jsonschema", "celpy", "prometheus_client",
                         "cryptography"})
"""images/operator/Dockerfile: python:3.11 base, the base dependencies and the operator extra."""


def release_contents(version: str, *, ours: bool = False) -> Contents:
    """A vllm-ascend release image; `ours`: built from images/vllm-ascend on it."""
    commands, modules = SHELL | {"vllm"}, VLLM_REQUIREMENTS | {"vllm", "vllm_ascend", "mooncake"}
    if ours:
        return Contents(f"the vllm-ascend {version} image built from images/vllm-ascend",
                        RELEASES[version].python, commands | OUR_SCRIPTS - {"pd-operator"},
                        modules | {"pd_operator"})
    return Contents(f"the vllm-ascend {version} release image", RELEASES[version].python, commands, modules)


def _repository(image: str) -> str:
    """The last path element of an image reference without tag or digest."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def of_image(image: str, *, tools_image: str, serving_name: str, serving_version: str | None,
             serving_ours: bool) -> Contents | None:
    """The contents of `image`; None when the operator cannot tell (an image of the user's own, say a
    proxy image: nothing is checked then). `serving_*` describe spec.image, which may name a release by
    spec.image.vllmAscendVersion rather than its tag. A vllm-ascend release tag is a release image
    whichever field names it; the tools image is otherwise taken to be the operator image, as the
    admin said."""
    if image == serving_name:
        version: str | None = serving_version or release_of_tag(image)
        return release_contents(version, ours=serving_ours) if version in RELEASES else None
    version = release_of_tag(image)
    if version is not None:
        return release_contents(version) if version in RELEASES else None
    if image == tools_image or _repository(image) == OPERATOR_REPOSITORY:
        return OPERATOR
    return None


EXECS_AFTER_SEPARATOR = frozenset({"pd-preflight"})
"""Commands that exec the argv after their `--` once their checks pass."""


def missing(argv: Sequence[str], image: Contents, mounts: Iterable[str]) -> list[str]:
    """What `argv` needs that a container of `image` with volumes at `mounts` lacks, as phrases;
    following what it execs: `sh -c '... exec "$@"' NAME ARGS...` runs ARGS, `pd-preflight ... -- CMD`
    runs CMD."""
    if not argv:
        return []
    exe = posixpath.basename(argv[0])
    if exe not in image.commands:
        return [f"no `{exe}`"]
    if exe == "sh" and len(argv) > 3 and argv[1] == "-c" and 'exec "$@"' in argv[2]:
        return missing(argv[4:], image, mounts)
    out: list[str] = []
    if exe == "python3" and len(argv) > 1:
        out += _python_missing(argv, image, set(mounts))
        exe = posixpath.basename(argv[1])
    if exe in EXECS_AFTER_SEPARATOR and "--" in argv:
        out += missing(argv[list(argv).index("--") + 1:], image, mounts)
    return out


def _python_missing(argv: Sequence[str], image: Contents, mounts: set[str]) -> list[str]:
    if argv[1] == "-m" and len(argv) > 2:
        top = argv[2].split(".")[0]
        return [] if top in image.modules else [f"no Python package {top}"]
    if posixpath.dirname(argv[1]) != bundle.MOUNT:
        return []
    out = []
    if image.python < bundle.MIN_PYTHON:
        out.append(f"python3 {'.'.join(map(str, image.python))}, older than the bundle's "
                   f"{'.'.join(map(str, bundle.MIN_PYTHON))}")
    if bundle.MOUNT not in mounts:
        out.append(f"no tools bundle (no volume is mounted at {bundle.MOUNT})")
    out += [f"no Python package {m}" for m in sorted(bundle.SERVING_MODULES - image.modules)]
    return out


def _containers(manifest: Mapping) -> list[dict]:
    pod = ((manifest.get("spec") or {}).get("template") or {}).get("spec") or {}
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def findings(manifests: Iterable[Mapping], contents_of: Callable[[str], Contents | None],
             field_of: Callable[[str], str]) -> list[Finding]:
    """An ImageCannotRun finding for every container of a rendered workload whose command its image
    cannot run, at the field that names the image (`field_of(image)`), once per field and command."""
    out: dict[tuple[str, str], Finding] = {}
    for manifest in manifests:
        for container in _containers(manifest):
            image = contents_of(container["image"])
            argv = [*(container.get("command") or []), *(container.get("args") or [])]
            if image is None or not argv:
                continue
            lacks = missing(argv, image, (m["mountPath"] for m in container.get("volumeMounts") or []))
            if not lacks:
                continue
            where, shown = field_of(container["image"]), " ".join(argv[:2])
            out.setdefault((where, shown), Finding(
                "ImageCannotRun", "error", where, "",
                f"The {container['name']} container runs `{shown} ...` in {container['image']}, "
                f"{image.kind}, which has {', '.join(lacks)}; name an image that has it"
                + (f" or leave {where} unset (the operator image runs it)." if where.startswith("spec.proxy")
                   else ".")))
    return list(out.values())

"""Podman for the `images` tier: build the images we ship (and stand-ins for the ones we cannot pull)
and run them as a kubelet would, on a fresh Debian machine, as root, with no container registry.

    python -m support.containers        # `make images`: podman, the base image and the tier's images

Why it is set up this way (each checked on these machines, issue 24):
- crun fails here ("cgroups in hybrid mode not supported"): runtime runc, cgroupfs, file events.
- runc cannot raise RLIMIT_NOFILE above the caller's limit, and podman's default asks for more
  ("setrlimit RLIMIT_NOFILE: Operation not permitted"): default_ulimits pins both limits lower.
- No registry: the base image is made from the machine's own Debian mirror with debootstrap, and a
  build gets it by digest (`by_digest`), as the Dockerfiles pin their published bases.
- PyPI's TLS needs the host's CA bundle: a build secret (`--mount=type=secret,id=cacert`), so the CA
  never lands in a layer.
- Config and storage live under .cache/containers (gitignored) and reach podman through
  CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, so the machine's own podman setup is untouched and
  deleting that directory is a cold start.
- An image is built only when none carries the hash of its inputs (label INPUTS_LABEL), and podman's
  layer cache makes a rebuild after a small change cheap: a warm run pays seconds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from support.cluster import Component

ROOT = pathlib.Path(__file__).resolve().parents[2]
STATE = ROOT / ".cache" / "containers"
PACKAGES = ("podman", "runc", "debootstrap", "skopeo")
BASE_IMAGE = "localhost/debian-python:bookworm"
BASE_SUITE = "bookworm"
# Debian's default mirror, when the machine's apt sources name none for BASE_SUITE.
DEFAULT_MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
INPUTS_LABEL = "dev.pd-serving.test.inputs"
# The lines of `podman build` worth showing while it runs ("[1/2] STEP 3/6: RUN ..." in multi-stage builds).
BUILD_STEP = re.compile(r"^(\[\d+/\d+\] )?STEP |^Successfully tagged ")
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
STORAGE_CONF = """\
[storage]
driver = "overlay"
graphroot = "{root}/storage"
runroot = "{root}/run"
"""


def progress(message: str) -> None:
    """One line on stderr, at once: cold steps take minutes and should say so."""
    print(f"containers: {message}", file=sys.stderr, flush=True)


def _sudo() -> list[str]:
    return [] if os.geteuid() == 0 else ["sudo"]


def install_packages() -> None:
    """apt-get install podman and its helpers when podman is missing (about 20 s)."""
    if shutil.which("podman") and shutil.which("runc") and shutil.which("debootstrap"):
        return
    progress(f"installing {' '.join(PACKAGES)} with apt-get (once per machine)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run([*_sudo(), *command], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")


@functools.cache
def environment() -> dict[str, str]:
    """The environment of every podman call: packages installed, config under STATE written."""
    install_packages()
    STATE.mkdir(parents=True, exist_ok=True)
    files = {"containers.conf": CONTAINERS_CONF, "storage.conf": STORAGE_CONF.format(root=STATE)}
    for name, text in files.items():
        path = STATE / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return {**os.environ, "CONTAINERS_CONF": str(STATE / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(STATE / "storage.conf")}


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`podman ARGS` with the tier's configuration; `check` raises with its output when it fails."""
    done = subprocess.run(["podman", *args], env=environment(), capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def label(image: str, key: str) -> str | None:
    """A label of a local image (None when the image or the label is missing)."""
    done = podman("image", "inspect", "--format", f'{{{{index .Labels "{key}"}}}}', image, check=False)
    value = done.stdout.strip()
    return value if done.returncode == 0 and value not in ("", "<no value>") else None


def apt_mirror(suite: str = BASE_SUITE) -> str:
    """The machine's Debian mirror for `suite`, from its apt sources (one-line and deb822 formats)."""
    sources = pathlib.Path("/etc/apt")
    files = [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*.list")),
             *sorted((sources / "sources.list.d").glob("*.sources"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE))
                if ("deb" in fields.get("Types", "").split() and suite in fields.get("Suites", "").split()
                        and "main" in fields.get("Components", "").split()):
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
                if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
                    return words[1]
    return DEFAULT_MIRROR


def base_image() -> str:
    """BASE_IMAGE: Debian with python3 (3.11 in bookworm) and python3-venv, made once with
    debootstrap from the machine's mirror (about a minute) and kept in STATE's storage."""
    environment()
    if exists(BASE_IMAGE):
        return BASE_IMAGE
    mirror = apt_mirror()
    started = time.monotonic()
    progress(f"making {BASE_IMAGE} with debootstrap from {mirror} (once; about a minute)")
    with tempfile.TemporaryDirectory(dir=STATE, prefix="rootfs-") as rootfs:
        done = subprocess.run(
            [*_sudo(), "debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             BASE_SUITE, rootfs, mirror], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr}")
        progress(f"importing {BASE_IMAGE}")
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["podman", "import", "--change", "CMD=/bin/bash", "-", BASE_IMAGE],
                                  stdin=tar.stdout, env=environment(), capture_output=True, text=True)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise RuntimeError(f"podman import exited {imported.returncode}:\n{imported.stderr}")
    progress(f"{BASE_IMAGE} made in {time.monotonic() - started:.0f} s")
    return BASE_IMAGE


# What a CPython prefix holds that an image needs none of: its tests, IDLE, Tk, and whatever was
# installed into its own site-packages (the image makes a venv).
PYTHON_LEAVE_OUT = ("test", "idlelib", "tkinter", "turtledemo", "__pycache__", "site-packages")


def _python_prefixes(version: str) -> list[pathlib.Path]:
    """Where this machine may have a CPython `version` (x.y) built as a relocatable prefix: pyenv's
    versions (the machines here have them), then an interpreter on PATH."""
    pyenv = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv")) / "versions"
    found = sorted(pyenv.glob(f"{version}.*"), reverse=True) if pyenv.is_dir() else []
    on_path = shutil.which(f"python{version}")
    if on_path and "shims" not in on_path:
        found.append(pathlib.Path(on_path).resolve().parents[1])
    return [p for p in found if (p / "bin" / f"python{version}").is_file()]


def release_python(version: str = "3.12") -> pathlib.Path:
    """A copy under STATE of this machine's CPython `version`, without what an image needs none of: the
    build context `python` of the stock-serving stand-in (vllm-ascend's images run 3.12, which Debian
    does not package and which nothing but the package registries could bring here)."""
    prefixes = _python_prefixes(version)
    if not prefixes:
        raise RuntimeError(f"no CPython {version} on this machine (pyenv or PATH): the stock-serving "
                           f"stand-in runs the vllm-ascend images' python3 {version}")
    source = prefixes[0]
    target = STATE / f"python-{source.name}"
    if not (target / "bin" / f"python{version}").is_file():
        progress(f"copying CPython {version} from {source} for the stock-serving stand-in (once)")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns(*PYTHON_LEAVE_OUT))
        (target / "lib" / f"python{version}" / "site-packages").mkdir()
    return target


def _copy_sources(dockerfile: pathlib.Path) -> list[str]:
    """The build-context paths a Dockerfile's COPY/ADD instructions read (not other stages')."""
    sources: list[str] = []
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD") or any(w.startswith("--from") for w in words):
            continue
        sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def local_images(text: str, build_args: Mapping[str, str]) -> set[str]:
    """The local images (made here, never pulled) a Dockerfile or its build arguments name."""
    named = set(re.findall(r"localhost/[\w./:-]+", text)) | set(build_args.values())
    return {name for name in named if name.startswith("localhost/")}


def by_digest(image: str) -> str:
    """A local image as `name@sha256:...`: a build names exactly the image it was made from, as the
    Dockerfiles pin their published bases (a tag can be moved, a digest cannot)."""
    digest = podman("image", "inspect", "--format", "{{.Digest}}", image).stdout.strip()
    return f"{image.rpartition(':')[0] if ':' in image.rpartition('/')[2] else image}@{digest}"


def inputs_hash(dockerfile: pathlib.Path, context: pathlib.Path, build_args: Mapping[str, str],
                contexts: Mapping[str, pathlib.Path] | None = None) -> str:
    """What decides an image: the Dockerfile, the build arguments, every file its COPYs read (as git
    sees them: ignored files are not sent, see .dockerignore), the local images it builds on, and the
    files of any named build context (by path and size: they are made here, not edited)."""
    text = dockerfile.read_text()
    digest = hashlib.sha256(text.encode())
    for key, value in sorted(build_args.items()):
        digest.update(f"\0arg {key}={value}".encode())
    for key, root in sorted((contexts or {}).items()):
        digest.update(f"\0context {key}".encode())
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            digest.update(f"\0{path.relative_to(root)}:{path.stat().st_size}".encode())
    for image in sorted(local_images(text, build_args)):
        digest.update(podman("image", "inspect", "--format", "{{.Id}}", image).stdout.encode())
    sources = _copy_sources(dockerfile)
    if sources:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *sources],
                                cwd=context, capture_output=True, text=True, check=True).stdout
        for name in sorted(n for n in listed.split("\0") if n):
            path = context / name
            if path.is_file():
                digest.update(f"\0file {name}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def build(image: str, dockerfile: pathlib.Path, context: pathlib.Path,
          build_args: Mapping[str, str] | None = None,
          contexts: Mapping[str, Callable[[], pathlib.Path]] | None = None, timeout: float = 1800) -> str:
    """`podman build` of `image` unless an image of that name already carries the hash of these inputs.
    A build that names BASE_IMAGE (in the Dockerfile or a build argument) makes it first; `contexts`
    makes the named build contexts (`COPY --from=NAME`). Returns `image`."""
    args = dict(build_args or {})
    if BASE_IMAGE in local_images(dockerfile.read_text(), args):
        base_image()
    named = {key: make() for key, make in (contexts or {}).items()}
    wanted = inputs_hash(dockerfile, context, args, named)
    if label(image, INPUTS_LABEL) == wanted:
        return image
    started = time.monotonic()
    progress(f"building {image} from {dockerfile.relative_to(ROOT)} (inputs {wanted})")
    argv = ["podman", "build", "--layers", "-f", str(dockerfile), "-t", image,
            "--secret", f"id=cacert,src={CA_BUNDLE}", "--label", f"{INPUTS_LABEL}={wanted}",
            *[a for k, v in args.items()
              for a in ("--build-arg", f"{k}={by_digest(v) if local_images('', {k: v}) else v}")],
            *[a for k, v in named.items() for a in ("--build-context", f"{k}={v}")], str(context)]
    output: list[str] = []
    with subprocess.Popen(argv, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if BUILD_STEP.match(line):
                progress(f"  {line.rstrip()}")
        code = proc.wait(timeout)
    if code != 0:
        raise RuntimeError(f"podman build of {image} exited {code}:\n{''.join(output[-80:])}")
    progress(f"built {image} in {time.monotonic() - started:.0f} s")
    return image


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_argv(image: str, command: Sequence[str] = (), *, options: Sequence[str] = (),
             name: str | None = None) -> list[str]:
    """`podman run --rm` of `image` in the foreground (signals to podman reach the container)."""
    return ["podman", "run", "--rm", *(["--name", name] if name else []), *options, image, *command]


def run(image: str, *command: str, options: Sequence[str] = (), input: str | None = None,
        timeout: float = 300) -> Ran:
    """Run `command` in a fresh container of `image` and wait: its exit code and output."""
    done = subprocess.run(run_argv(image, command, options=options), env=environment(), input=input,
                          capture_output=True, text=True, timeout=timeout)
    return Ran(done.returncode, done.stdout, done.stderr)


def remove(name: str) -> None:
    """Remove a container whatever its state (nothing when it is already gone)."""
    podman("rm", "--force", "--time", "0", name, check=False)


def security_options(pod_spec: Mapping, container: Mapping) -> list[str]:
    """podman options for what a kubelet enforces of a pod's and its container's securityContext (the
    container's fields win): user and group, read-only root, dropped capabilities, no privilege
    escalation. seccompProfile RuntimeDefault is podman's default profile."""
    ctx = {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    if ctx.get("runAsNonRoot") and ctx.get("runAsUser") in (0, None):
        raise ValueError("runAsNonRoot needs a numeric non-root runAsUser here (no image user lookup)")
    options = []
    if "runAsUser" in ctx:
        options += ["--user", f"{ctx['runAsUser']}:{ctx.get('runAsGroup', 0)}"]
    if ctx.get("readOnlyRootFilesystem"):
        # Only the pod's volumes are writable: no tmpfs of podman's own on /tmp, /run, /var/tmp.
        options += ["--read-only", "--read-only-tmpfs=false"]
    options += [f"--cap-drop={cap}" for cap in (ctx.get("capabilities") or {}).get("drop") or []]
    options += [f"--cap-add={cap}" for cap in (ctx.get("capabilities") or {}).get("add") or []]
    if ctx.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    if ctx.get("privileged"):
        options.append("--privileged")
    return options


def env_options(container: Mapping, fields: Mapping[str, str]) -> list[str]:
    """`--env` options for a container's env, downward-API fields taken from `fields` (fieldPath ->
    value, e.g. {"status.podIP": "127.0.0.1"}), a Secret's key as `<secret>.<key>`."""
    options = []
    for entry in container.get("env") or []:
        if "value" in entry:
            value = str(entry["value"])
        elif secret := entry.get("valueFrom", {}).get("secretKeyRef"):
            value = f"{secret['name']}.{secret.get('key', '')}"  # a stand-in: no Secret here
        else:
            path = (entry.get("valueFrom", {}).get("fieldRef") or {}).get("fieldPath")
            if path not in fields:
                raise ValueError(f"env {entry['name']}: no value for {entry.get('valueFrom')}")
            value = fields[path]
        options += ["--env", f"{entry['name']}={value}"]
    return options


# Volume kinds a kubelet always mounts read-only.
READ_ONLY_VOLUMES = {"configMap", "secret", "projected", "downwardAPI"}
# What a sizeLimit's binary suffixes are in podman's tmpfs `size=` option.
TMPFS_SIZE_SUFFIX = {"Ki": "k", "Mi": "m", "Gi": "g"}


def volume_options(pod_spec: Mapping, container: Mapping, sources: Mapping[str, pathlib.Path]) -> list[str]:
    """podman options for a container's volumeMounts: an emptyDir is a tmpfs (its sizeLimit kept) unless
    `sources` names a host directory for it (one the pod's containers share); any other volume is the
    host directory `sources` names for it, read-only for the kinds a kubelet mounts read-only
    (configMap, secret, projected, downwardAPI) or when the mount says so."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    options = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume and mount["name"] not in sources:
            size = str((volume["emptyDir"] or {}).get("sizeLimit", ""))
            for suffix, short in TMPFS_SIZE_SUFFIX.items():
                size = size.replace(suffix, short)
            options += ["--tmpfs", f"{mount['mountPath']}:mode=1777" + (f",size={size}" if size else "")]
            continue
        if mount["name"] not in sources:
            raise ValueError(f"volume {mount['name']} ({sorted(volume)}) has no host directory here")
        read_only = mount.get("readOnly") or bool(READ_ONLY_VOLUMES & set(volume))
        options += ["--volume", f"{sources[mount['name']]}:{mount['mountPath']}{':ro' if read_only else ''}"]
    return options


def command_options(container: Mapping) -> tuple[list[str], list[str]]:
    """(podman options, command) that run a container's `command` and `args` as a kubelet does: the
    command replaces the image's entrypoint (and so its default arguments), the args follow."""
    options = ["--entrypoint", json.dumps(list(container["command"]))] if container.get("command") else []
    return options, list(container.get("args") or [])


class InContainer:
    """For a Component whose argv is `run_argv(..., name=self.container)`: stopping or killing it also
    removes the container. Killing only the podman client would leave the container running."""

    container: str

    def stop(self, timeout: float = 10.0) -> int | None:
        code = super().stop(timeout)  # type: ignore[misc]
        remove(self.container)
        return code  # type: ignore[no-any-return]

    def kill(self) -> None:
        podman("kill", self.container, check=False)
        super().kill()  # type: ignore[misc]
        remove(self.container)


def container_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


class Container(InContainer, Component):
    """A container in the background, for fixtures: `start()`, `stop()` (SIGTERM, as the kubelet
    stops a pod), `kill()`, `running()`, `logs()`; with `with`, stopped and removed at the end."""

    def __init__(self, image: str, command: Sequence[str] = (), *, options: Sequence[str] = (),
                 log: pathlib.Path, name: str = "pd-test") -> None:
        self.container = container_name(name)
        super().__init__(self.container, run_argv(image, command, options=options, name=self.container),
                         log, environment())

    def __enter__(self) -> Container:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout=30)

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


# The images the tier builds. Each is a (name, Dockerfile, context, build args) so `make images` and
# the tests agree on the inputs (and so on the hash that lets a warm run skip the build).
OPERATOR = ("localhost/pd-operator:test", ROOT / "images" / "operator" / "Dockerfile", ROOT,
            {"BASE_IMAGE": BASE_IMAGE})
STOCK_SERVING = ("localhost/stock-serving:test", ROOT / "tests" / "support" / "images" / "stock-serving" /
                 "Dockerfile", ROOT / "tests" / "support", {"BASE_IMAGE": BASE_IMAGE},
                 {"python": release_python})
# The same with the seed change's function in its vllm-ascend tree: the stand-in for an image built from
# images/vllm-ascend (which cannot be built here: it starts from a stock image), as the pods see it.
SEED_SERVING = ("localhost/seed-serving:test", *STOCK_SERVING[1:3],
                {**STOCK_SERVING[3], "VLLM_ASCEND_SEED": "1"}, STOCK_SERVING[4])
TIER = (OPERATOR, STOCK_SERVING, SEED_SERVING)


def main() -> None:
    started = time.monotonic()
    for spec in TIER:
        build(*spec)
    progress(f"images ready in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()

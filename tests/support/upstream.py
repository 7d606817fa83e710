"""The upstream code the contract tier reads, pinned: vllm-ascend's released source archives and the
Mooncake NPU wheel those releases' images install.

    python tests/support/upstream.py        # fetch everything pinned into .cache/upstream

vllm-ascend publishes only source archives on PyPI. `pip download --no-binary :all: vllm-ascend==X`
cannot be used to fetch them: pip prepares the package's metadata first, which installs its build
requirements (torch, torch-npu, cmake: about 1 GB per version) and fails without them. So this reads
PyPI's simple index (PEP 691 JSON, the API pip itself uses), downloads the `.tar.gz`, checks it
against the sha256 pinned below and unpacks it.

The serving images install `mooncake-transfer-engine-npu` (each release's Dockerfile pins it with
`ARG MOONCAKE_TAG`); its Ascend transport (`ascend_transport.so`, which reads the ASCEND_* timeouts)
is not in the CPU wheel installed in .venv. That wheel is fetched with `pip download` (a binary
wheel needs no build) for x86_64 and unpacked; the tier only reads its strings, it never loads it.
Everything here is a build artefact: .cache is ignored by git, nothing from it is committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PD_UPSTREAM_CACHE", ROOT / ".cache" / "upstream"))
INDEX = "https://pypi.org/simple/vllm-ascend/"

# Version -> sha256 of its PyPI source archive (read from the index when the pin was added).
VLLM_ASCEND_ARCHIVES: dict[str, str] = {
    "0.23.0": "a58db76eaffcf328b13b315a0db3a57d381a8947d01057ddcefe4ad02372b242",
    "0.28.0rc1": "bde8bf4207d225df86d8f3b7d9b2bd89ff5e5e56af0cbe4bf8b5b691b98bbe95",
    "0.29.0rc1": "680f58f98b8a8a4d92380f77a5d3949107da6db0b7cfc17834898d32fdfcdfd1",
    "0.30.0rc2": "05cb51448c0cd174ea338b16ebbfc8e215f44b373ea2a0d65f1314523a01152f",
}

# mooncake-transfer-engine-npu version -> sha256 of its CPython 3.11 manylinux_2_35_x86_64 wheel.
MOONCAKE_NPU_WHEELS: dict[str, str] = {
    "0.3.11.post1": "d9e2b5c7c140004637451953ee5a48497942d71375b2e4435c5520ef84d2826c",
}
MOONCAKE_WHEEL_TAGS = ("--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                       "--platform", "manylinux_2_35_x86_64")


def source_dir(version: str) -> Path:
    """Where the unpacked source of one version lives (its `vllm_ascend/` package is inside)."""
    return CACHE / f"vllm_ascend-{version}"


def _archive_url(version: str) -> str:
    request = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        files = json.load(response)["files"]
    name = f"vllm_ascend-{version}.tar.gz"
    for entry in files:
        if entry["filename"] == name:
            return entry["url"]
    raise SystemExit(f"{INDEX} lists no {name}")


def fetch(version: str) -> Path:
    target = source_dir(version)
    if (target / "vllm_ascend").is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"vllm_ascend-{version}.tar.gz"
    if not archive.exists():
        partial = archive.with_suffix(".part")
        with urllib.request.urlopen(_archive_url(version), timeout=600) as response, \
                partial.open("wb") as out:
            shutil.copyfileobj(response, out)
        partial.rename(archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != VLLM_ASCEND_ARCHIVES[version]:
        archive.unlink()
        raise SystemExit(f"{archive.name}: sha256 {digest}, pinned {VLLM_ASCEND_ARCHIVES[version]}")
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    if not (target / "vllm_ascend").is_dir():
        raise SystemExit(f"{archive.name} did not unpack to {target}/vllm_ascend")
    return target


def mooncake_dir(version: str) -> Path:
    """Where the unpacked Mooncake NPU wheel of one version lives (its `mooncake/` package is inside)."""
    return CACHE / f"mooncake_transfer_engine_npu-{version}"


def fetch_mooncake(version: str) -> Path:
    target = mooncake_dir(version)
    if (target / "mooncake").is_dir():
        return target
    download = CACHE / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    *MOONCAKE_WHEEL_TAGS, "-d", str(download), f"mooncake-transfer-engine-npu=={version}"],
                   check=True)
    (wheel,) = download.glob(f"mooncake_transfer_engine_npu-{version}-*.whl")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != MOONCAKE_NPU_WHEELS[version]:
        wheel.unlink()
        raise SystemExit(f"{wheel.name}: sha256 {digest}, pinned {MOONCAKE_NPU_WHEELS[version]}")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target


def main() -> int:
    for version in VLLM_ASCEND_ARCHIVES:
        print(f"vllm-ascend {version}: {fetch(version)}")
    for version in MOONCAKE_NPU_WHEELS:
        print(f"mooncake-transfer-engine-npu {version}: {fetch_mooncake(version)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

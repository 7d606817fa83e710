"""The upstream code the contract tier reads: vllm-ascend's released source archives, pinned.

    python tests/contract/upstream.py        # fetch every pinned archive into .cache/upstream

vllm-ascend publishes only source archives on PyPI. `pip download --no-binary :all: vllm-ascend==X`
cannot be used to fetch them: pip prepares the package's metadata first, which installs its build
requirements (torch, torch-npu, cmake: about 1 GB per version) and fails without them. So this reads
PyPI's simple index (PEP 691 JSON, the API pip itself uses), downloads the `.tar.gz`, checks it
against the sha256 pinned below and unpacks it. Archives are build artefacts: .cache is ignored by
git, nothing from them is committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import urllib.request
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


def main() -> int:
    for version in VLLM_ASCEND_ARCHIVES:
        print(f"vllm-ascend {version}: {fetch(version)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The serving image's dependency step (images/vllm-ascend/Dockerfile: prune the lock to what the base
lacks, pip install it hash-checked, check the rest), run as written in the stock stand-in: a Python 3.12
with vLLM's share of the dependencies (pyyaml 6.0.3, pydantic, aiohttp's attrs), as the release image
has them. The real serving image cannot be built here (its base is a stock image); this is its step,
on the release's Python, from PyPI."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from support import containers

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
SERVING = ROOT / "images/vllm-ascend"


def dependency_step() -> str:
    """The Dockerfile's RUN that installs the lock, continuation lines joined."""
    (step,) = re.findall(r"^RUN (python3 /locks/base_lacks\.py prune (?:.*\\\n)*.*)$",
                         (SERVING / "Dockerfile").read_text(), flags=re.M)
    return step.replace("\\\n", " ")


@pytest.fixture(scope="module")
def stock_image() -> str:
    return containers.build(*containers.STOCK_SERVING)


def test_the_serving_images_dependency_step_installs_the_lock_and_keeps_vllms_set(stock_image, tmp_path):
    for name in ("requirements.in", "requirements.lock", "base_lacks.py"):
        shutil.copy(SERVING / name, tmp_path / name)
    script = (f"cp -r /mnt/locks /locks && {dependency_step()} && "
              "python3 -c 'import celpy, jsonschema, yaml; print(yaml.__version__, jsonschema.__name__)'")
    done = containers.run(stock_image, "bash", "-o", "pipefail", "-c", script, options=[
        "--volume", f"{tmp_path}:/mnt/locks:ro",
        "--volume", f"{containers.CA_BUNDLE}:/etc/pd-ca.crt:ro", "--env", "PIP_CERT=/etc/pd-ca.crt"],
        timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # Installed: what requirements.in pins and what the base lacked, each hash-checked ...
    assert "--require-hashes" in dependency_step()
    assert re.search(r"Successfully installed .*cel-python-0\.5\.0", done.stdout)
    assert re.search(r"Successfully installed .*jsonschema-4\.26\.0", done.stdout)
    assert re.search(r"Successfully installed .*lark-", done.stdout)
    # ... and vLLM's pyyaml left as the base has it (the lock names 6.0.4), yet enough for cel-python.
    assert "PyYAML" not in done.stdout.split("Successfully installed", 1)[1].split("\n", 1)[0]
    assert done.stdout.strip().splitlines()[-1] == "6.0.3 jsonschema"

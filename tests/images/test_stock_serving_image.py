"""The stand-in for a stock vllm-ascend image (tests/support/images/stock-serving): what a rendered
container may find in quay.io/ascend/vllm-ascend:v0.30.0rc2, and nothing of ours.

Stock images cannot be pulled here; the stand-in is what the `images` tier runs rendered serving
commands in, so it must hold what a stock image holds (python3 importing vllm_ascend and Mooncake's
engine, a `vllm` command) and must not hold pd_operator: a command that needs our package would
then pass here and crash on a cluster (issue 24).
"""

from __future__ import annotations

import json

import pytest

from pd_operator.serving_image.capabilities import RELEASES
from support import containers

pytestmark = pytest.mark.images


@pytest.fixture(scope="module")
def stock_image() -> str:
    return containers.build(*containers.STOCK_SERVING)


def test_stock_stand_in_has_vllm_ascend_and_mooncake(stock_image):
    done = containers.run(stock_image, "python3", "-c",
                          "import vllm_ascend, mooncake; from mooncake.engine import TransferEngine; "
                          "from vllm_ascend._version import version; print(vllm_ascend.__file__, version)")
    assert done.returncode == 0, done.stderr
    # Where the release's editable install puts it, and the release it plays.
    assert done.stdout.split() == ["/vllm-workspace/vllm-ascend/vllm_ascend/__init__.py", "0.30.0rc2"]


def test_stock_stand_in_has_nothing_of_ours(stock_image):
    done = containers.run(stock_image, "sh", "-c",
                          "for c in pd-preflight pd-kv-probe pd-proxy pd-operator pdctl; do "
                          "command -v $c && exit 1; done; python3 -c 'import pd_operator'")
    assert done.returncode != 0 and "No module named 'pd_operator'" in done.stderr, (done.stdout, done.stderr)


def test_stock_stand_in_vllm_records_its_argv_and_env_when_told_to(stock_image):
    done = containers.run(stock_image, "vllm", "serve", "/models/x", "--port", "8000",
                          options=["--env", "VLLM_TEST=1", "--env", "PD_TEST_RECORD=1"])
    assert done.returncode == 0, done.stderr
    recorded = json.loads(done.stdout)
    assert recorded["argv"][1:] == ["serve", "/models/x", "--port", "8000"]
    assert recorded["env"]["VLLM_TEST"] == "1"


def test_stock_stand_in_has_the_release_images_python_and_what_vllm_brings(stock_image):
    """The image model's python3 of the release it plays (3.12), with vLLM's oldest allowed pydantic."""
    done = containers.run(stock_image, "python3", "-c",
                          "import sys, pydantic, numpy, yaml, aiohttp; "
                          "print(*sys.version_info[:2], pydantic.VERSION)")
    assert done.returncode == 0, done.stderr
    major, minor, pydantic = done.stdout.split()
    assert (int(major), int(minor)) == RELEASES["0.30.0rc2"].python
    assert pydantic == "2.12.0"

"""The image contents model (pd_operator.serving_image.contents) and the validator's check of every
rendered container against it (ImageCannotRun): a command its image cannot run is refused at the field
that names the image; every example's containers pass."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

from pd_operator.render.runnable import validate
from pd_operator.serving_image import bundle
from pd_operator.serving_image.capabilities import RELEASES
from pd_operator.serving_image.contents import (
    DEFAULT_TOOLS_IMAGE,
    OPERATOR,
    OUR_SCRIPTS,
    Contents,
    findings,
    missing,
    of_image,
    release_contents,
)
from support.renders import VALID_EXAMPLES
from support.specs import example

ROOT = Path(__file__).resolve().parents[2]
STOCK = "quay.io/ascend/vllm-ascend:v0.30.0rc2-a3"
GLM = next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-1p1d-tp4")
RELEASE = release_contents("0.30.0rc2")
PREFLIGHT = [*bundle.command("pd-preflight"), "--config", "/etc/pd/preflight-decode.json", "--"]


def codes(doc: dict, **kwargs) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in validate(doc, **kwargs).errors]


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_every_example_names_images_that_run_its_containers(path):
    result = validate(example(path))
    assert result.ok and result.resolved is not None
    assert not [f for f in result.findings if f.code == "ImageCannotRun"]


def test_a_proxy_image_without_pd_proxy_is_refused_at_its_field():
    doc = example(GLM)
    doc["spec"].setdefault("proxy", {})["image"] = STOCK
    result = validate(doc)
    assert codes(doc) == [("ImageCannotRun", "spec.proxy.image")]
    assert result.resolved is None
    (finding,) = result.errors
    assert "no `pd-proxy`" in finding.message and "leave spec.proxy.image unset" in finding.message
    # An image the model does not know (a proxy image of the user's own) is trusted.
    doc["spec"]["proxy"]["image"] = "registry.example.com/team/router:1.2"
    assert validate(doc).ok


def test_a_tools_image_the_model_knows_cannot_bundle_is_refused_at_the_operators_flag():
    """The operator started with --tools-image naming a serving image: no pod could start."""
    tools = "quay.io/ascend/vllm-ascend:v0.29.0rc1"
    assert codes(example(GLM), tools_image=tools) == [("ImageCannotRun", "pd-operator --tools-image")] * 2


def test_the_proxy_defaults_to_the_tools_image():
    result = validate(example(GLM), tools_image="registry.example.com/mirror/pd-operator:0.1.0")
    assert result.resolved is not None
    assert result.resolved.proxy_image() == "registry.example.com/mirror/pd-operator:0.1.0"


def test_the_model_follows_what_a_command_execs():
    serve = ["vllm", "serve", "m"]
    mounts = [bundle.MOUNT]
    assert missing([*PREFLIGHT, *serve], RELEASE, mounts) == []
    assert missing([*PREFLIGHT, *serve], RELEASE, []) == [f"no tools bundle (no volume is mounted at "
                                                           f"{bundle.MOUNT})"]
    no_vllm = Contents("x", (3, 12), frozenset({"python3", "sh"}), RELEASE.modules)
    assert missing([*PREFLIGHT, *serve], no_vllm, mounts) == ["no `vllm`"]
    prelude = ["/bin/sh", "-c", 'set -e; exec "$@"', "pd-serve"]
    assert missing([*prelude, *PREFLIGHT, *serve], no_vllm, mounts) == ["no `vllm`"]
    old = Contents("x", (3, 10), RELEASE.commands, RELEASE.modules - {"numpy"})
    assert missing(PREFLIGHT, old, mounts) == ["python3 3.10, older than the bundle's 3.11",
                                               "no Python package numpy"]
    assert missing(["pd-proxy", "--port", "8000"], RELEASE, []) == ["no `pd-proxy`"]
    assert missing(["pd-proxy", "--port", "8000"], OPERATOR, []) == []


def test_images_are_told_apart_by_reference():
    serving = {"serving_name": "registry.example.com/pd-vllm-ascend:seed", "serving_version": "0.30.0rc2",
               "serving_ours": True}
    assert of_image(DEFAULT_TOOLS_IMAGE, tools_image=DEFAULT_TOOLS_IMAGE, **serving) is OPERATOR
    assert of_image("mirror.example.com/x/pd-operator:0.2.0@sha256:ab", tools_image=DEFAULT_TOOLS_IMAGE,
                    **serving) is OPERATOR
    ours = of_image(serving["serving_name"], tools_image=DEFAULT_TOOLS_IMAGE, **serving)
    assert ours is not None and "pd_operator" in ours.modules and "pd-preflight" in ours.commands
    stock = of_image(STOCK, tools_image=DEFAULT_TOOLS_IMAGE, **serving)
    assert stock == RELEASE and not stock.commands & OUR_SCRIPTS and "pd_operator" not in stock.modules
    assert of_image("registry.example.com/other:1", tools_image=DEFAULT_TOOLS_IMAGE, **serving) is None


def test_every_release_runs_the_bundle():
    for version in RELEASES:
        image = release_contents(version)
        assert image.python >= bundle.MIN_PYTHON and image.modules >= bundle.SERVING_MODULES


def test_our_scripts_are_the_packages_console_scripts():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == OUR_SCRIPTS


def test_a_finding_per_field_and_command_not_per_pod():
    doc = example(GLM)
    doc["spec"]["decode"]["replicas"] = 3
    doc["spec"].setdefault("proxy", {})["image"] = STOCK
    assert codes(doc) == [("ImageCannotRun", "spec.proxy.image")]


def test_findings_read_init_containers_and_args():
    pod = {"spec": {"template": {"spec": {
        "initContainers": [{"name": "init", "image": "a", "command": ["pd-bundle"], "args": ["/x"]}],
        "containers": [{"name": "main", "image": "b", "command": ["vllm"], "args": ["serve"]}]}}}}
    models = {"a": RELEASE, "b": RELEASE}
    out = findings([copy.deepcopy(pod)], models.get, lambda image: f"field-of-{image}")
    assert [(f.path, "`pd-bundle /x ...`" in f.message) for f in out] == [("field-of-a", True)]

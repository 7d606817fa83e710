"""Every example renders to exactly its golden file; a change shows up as a reviewed diff."""

from __future__ import annotations

import difflib

import pytest
import yaml

from pd_operator.render import render
from pd_operator.render.yaml_text import to_yaml
from support.renders import VALID_EXAMPLES, rendered
from support.specs import resolve

GOLDEN = VALID_EXAMPLES[0].parents[1] / "tests" / "render" / "golden"


@pytest.mark.parametrize("example", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_render_matches_golden(example, update_golden):
    text = to_yaml(rendered(example))
    golden = GOLDEN / f"{example.stem}.yaml"
    if update_golden:
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing; create it with `pytest tests/render --update-golden`"
    expected = golden.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                        str(golden), "rendered", n=2))
    assert text == expected, f"render differs from the golden file (review, then --update-golden):\n{diff}"


def test_every_golden_file_has_its_example():
    stems = {p.stem for p in VALID_EXAMPLES}
    assert {g.stem for g in GOLDEN.glob("*.yaml")} == stems


def test_render_is_deterministic_and_does_not_alias():
    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    first, second = render(resolve(doc)), render(resolve(doc))
    assert first == second
    assert "&id" not in to_yaml(first)  # no YAML anchors: no sub-object is shared
    first[0]["metadata"]["labels"]["x"] = "y"
    assert "x" not in second[0]["metadata"]["labels"]

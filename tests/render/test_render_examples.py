"""The examples: each is a valid PDDeployment (CRD schema, CEL rules, validator) whose render
passes Kubernetes' own schemas and every pod-level property; the incompatible one is refused with
exactly the findings its .expected.txt lists."""

from __future__ import annotations

import pytest

from pd_operator.api.schema_check import schema_problems
from pd_operator.render import render
from support.render_properties import check_all
from support.renders import INCOMPATIBLE, VALID_EXAMPLES, validated
from support.specs import example


def test_there_are_examples_of_each_kind():
    names = {p.stem for p in VALID_EXAMPLES}
    assert {"glm-5.3-flash-tp8-dp2tp4", "glm-5.3-flash-1p1d-tp4", "deepseek-v3.2-multinode-decode",
            "qwen3-next-a2"} <= names


@pytest.mark.parametrize("path", [*VALID_EXAMPLES, INCOMPATIBLE], ids=lambda p: p.stem)
def test_example_passes_the_crd_schema(path):
    assert schema_problems(example(path)) == []


@pytest.mark.parametrize("example", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_example_validates_and_renders_correctly(example, tmp_path):
    validation = validated(example)
    assert validation.ok, [f.line() for f in validation.errors]
    check_all(validation, render(validation.resolved), tmp_path)


def test_multi_pod_example_really_spans_pods():
    validation = validated(next(p for p in VALID_EXAMPLES if p.stem.startswith("deepseek")))
    plan = validation.shapes["decode"]
    assert plan.pods == 2 and plan.dp_local == 2


def test_incompatible_example_gives_the_expected_findings():
    validation = validated(INCOMPATIBLE)
    assert not validation.ok
    expected = INCOMPATIBLE.with_suffix(".expected.txt").read_text().splitlines()
    assert [f.line() for f in validation.findings] == expected
    assert validation.resolved is None  # nothing to render: the type admits no unservable spec


def test_requesting_the_engine_block_size_is_a_fixpoint():
    """The renderer passes the resolved engine block as `--block-size`; vLLM must then resolve the
    same block again rather than something else (hybrid unification rounds requests up)."""
    from pd_operator.kv import presets
    from pd_operator.kv.blocksize import side_layout
    from pd_operator.kv.pages import LayoutError
    from pd_operator.kv.side import Side

    checked = 0
    for name in presets.names():
        for tp in (1, 2, 4, 8):
            for spec_tokens in (0, 2):
                try:
                    block = side_layout(Side("decode", presets.get(name), tp,
                                             num_speculative_tokens=spec_tokens)).engine_block_size
                except LayoutError:
                    continue
                again = side_layout(Side("decode", presets.get(name), tp, block_size=block,
                                         num_speculative_tokens=spec_tokens)).engine_block_size
                assert again == block, (name, tp, spec_tokens)
                checked += 1
    assert checked > 20

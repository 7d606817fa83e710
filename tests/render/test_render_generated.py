"""Generated valid specs render to manifests with every property the examples have, and random
documents never make the validator or the CLI raise: they give findings with field paths."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pd_operator.render import render
from pd_operator.render.runnable import validate
from support.render_properties import check_all
from support.spec_strategies import deployments

# celpy raises the recursion limit when it first builds its parser; do that before hypothesis runs
# (hypothesis warns when the limit changes under it).
validate({})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(deployments())
def test_generated_valid_specs_render_correctly(doc):
    validation = validate(doc)
    assume(validation.ok)
    with tempfile.TemporaryDirectory() as work:
        check_all(validation, render(validation.resolved), Path(work))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children,
                                                                      max_size=4),
    max_leaves=12)
SPEC_KEYS = ("model", "image", "kvTransfer", "prefill", "decode", "proxy", "servingPort")


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(SPEC_KEYS), json_values, max_size=7), st.data())
def test_random_specs_give_findings_with_paths(spec, data):
    base = {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": "x"}}
    validation = validate({**base, "spec": spec})
    assert not validation.ok or validation.deployment is not None
    for finding in validation.errors:
        assert finding.path and finding.message
    if validation.resolved is not None:
        render(validation.resolved)

"""Why the spec's rules alone (spec/validate.py `spec_rules_only`) are not the validator: they pass a
spec whose pods could not start, which the one validator (render/runnable.py `validate`, what pdctl, the
webhook and the controller call) refuses. tests/test_layout.py keeps every other caller away from them."""

from __future__ import annotations

from pd_operator.render.runnable import check, validate
from pd_operator.spec.validate import spec_rules_only
from support.renders import VALID_EXAMPLES
from support.specs import example

GLM = next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-1p1d-tp4")
STOCK = "quay.io/ascend/vllm-ascend:v0.30.0rc2-a3"
"""A vllm-ascend release image: it has no `pd-proxy`."""


def test_the_spec_rules_alone_pass_a_proxy_that_cannot_run_and_the_validator_refuses_it():
    doc = example(GLM)
    doc["spec"].setdefault("proxy", {})["image"] = STOCK
    alone = spec_rules_only(doc)
    assert alone.ok and alone.resolved is not None
    public = validate(doc)
    assert [(f.code, f.path) for f in public.errors] == [("ImageCannotRun", "spec.proxy.image")]
    assert public.resolved is None and check(doc).templates is None


def test_on_a_servable_spec_the_validator_adds_nothing_to_the_spec_rules():
    doc = example(GLM)
    alone, public = spec_rules_only(doc), validate(doc)
    assert public.ok and public.findings == alone.findings
    assert public.resolved is not None and alone.resolved is not None
    assert public.resolved.deployment == alone.resolved.deployment
    assert public.resolved.layout_hash == alone.resolved.layout_hash

"""spec.scaling's bounds and the PDRoles, without a cluster: the effective instance counts for what
the PDRoles ask (a table), the bounds validate refuses, the rendered PDRole, what the operator
applies of it (never spec.replicas), when it creates or forwards a count, and the PDRole's status."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from pd_operator.api.conditions import MAX_RATIO, MAX_REPLICAS, MIN_RATIO, MIN_REPLICAS
from pd_operator.api.crd import PDROLE, crd
from pd_operator.api.labels import APPLIED_HASH, DEPLOYMENT, FORWARDED_REPLICAS, ROLE
from pd_operator.api.schema_check import schema_problems
from pd_operator.api.types import ROLE_KIND, PDRole, ScalingSpec
from pd_operator.controller import pdroles
from pd_operator.controller.diff import diff, stamp
from pd_operator.controller.rollout import RoleFigures
from pd_operator.render import render
from pd_operator.render.proxy import members
from pd_operator.render.runnable import validate
from pd_operator.spec.scaling import Hold, bound, findings
from pd_operator.spec.validate import with_instances
from support.specs import ROOT, example

pytestmark = pytest.mark.scaling

UID = "0b1c2d3e-0000-4000-8000-000000000002"


def _scaling(prefill=(0, None), decode=(0, None), ratio=(None, None)) -> ScalingSpec:
    return ScalingSpec.model_validate({
        "prefill": {"minReplicas": prefill[0], "maxReplicas": prefill[1]},
        "decode": {"minReplicas": decode[0], "maxReplicas": decode[1]},
        "ratio": {"minPrefillPerDecode": ratio[0], "maxPrefillPerDecode": ratio[1]}})


# (bounds, requested (prefill, decode)) -> effective (prefill, decode), {role: bound that held it}
CASES = [
    ("no bounds", _scaling(), (3, 7), (3, 7), {}),
    ("within every bound", _scaling((1, 4), (1, 4), (0.5, 2)), (2, 3), (2, 3), {}),
    ("decode above its max", _scaling(decode=(0, 2)), (1, 5), (1, 2), {"decode": MAX_REPLICAS}),
    ("prefill below its min", _scaling(prefill=(2, None)), (0, 1), (2, 1), {"prefill": MIN_REPLICAS}),
    ("decode scaled to 0 under a min", _scaling(decode=(1, None)), (1, 0), (1, 1), {"decode": MIN_REPLICAS}),
    ("too many prefill per decode", _scaling(ratio=(None, 2)), (5, 2), (4, 2), {"prefill": MAX_RATIO}),
    ("fractional max ratio is exact", _scaling(ratio=(None, 1.5)), (9, 2), (3, 2), {"prefill": MAX_RATIO}),
    ("too many decode per prefill", _scaling(ratio=(0.5, None)), (1, 5), (1, 2), {"decode": MIN_RATIO}),
    ("decode at 0 takes prefill to 0", _scaling(ratio=(None, 1)), (2, 0), (0, 0), {"prefill": MAX_RATIO}),
    ("the ratio lowering stops at the role's min", _scaling((1, None), (1, None), (None, 1)), (3, 1), (1, 1),
     {"prefill": MAX_RATIO}),
    ("a role max first, then the ratio on the other role", _scaling(decode=(0, 2), ratio=(None, 1)),
     (4, 4), (2, 2), {"prefill": MAX_RATIO, "decode": MAX_REPLICAS}),
    ("a narrow ratio lowers both roles until it holds", _scaling(ratio=(1.5, 1.5)), (2, 3), (0, 0),
     {"prefill": MAX_RATIO, "decode": MIN_RATIO}),
    ("exactly at the ratio is within it", _scaling(ratio=(2, 2)), (4, 2), (4, 2), {}),
]


@pytest.mark.parametrize(("bounds", "requested", "effective", "held"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_effective_count_is_the_request_held_at_the_bounds(bounds, requested, effective, held):
    assert findings(bounds) == []
    result = bound({"prefill": requested[0], "decode": requested[1]}, bounds)
    assert (result.effective["prefill"], result.effective["decode"]) == effective
    assert {h.role: h.bound for h in result.holds} == held
    for h in result.holds:
        assert (h.requested, h.effective) == (result.requested[h.role], result.effective[h.role])
    p, d = effective
    ratio = bounds.ratio
    assert ratio.max_prefill_per_decode is None or p <= ratio.max_prefill_per_decode * d
    assert ratio.min_prefill_per_decode is None or p >= ratio.min_prefill_per_decode * d


def test_a_hold_names_the_field_and_what_to_change():
    assert Hold("decode", MAX_REPLICAS, 5, 2).message() == (
        "decode asks for 5 instances and runs 2, held by spec.scaling.decode.maxReplicas: raise "
        "spec.scaling.decode.maxReplicas to run more.")
    assert Hold("prefill", MAX_RATIO, 5, 4).message().endswith(
        "held by spec.scaling.ratio.maxPrefillPerDecode: raise spec.scaling.ratio.maxPrefillPerDecode or "
        "scale decode up first.")
    assert Hold("decode", MIN_RATIO, 5, 2).field == "spec.scaling.ratio.minPrefillPerDecode"


@pytest.mark.parametrize(("bounds", "path"), [
    (_scaling(decode=(3, 2)), "spec.scaling.decode.minReplicas"),
    (_scaling(ratio=(2, 1)), "spec.scaling.ratio.minPrefillPerDecode"),
    (_scaling((3, None), (1, None), (None, 2)), "spec.scaling.prefill.minReplicas"),
    (_scaling((1, None), (2, None), (1, None)), "spec.scaling.decode.minReplicas"),
])
def test_bounds_that_cannot_hold_are_refused_with_the_field(bounds, path):
    (finding,) = findings(bounds)
    assert (finding.code, finding.severity, finding.path) == ("ScalingBounds", "error", path)
    doc = example()
    doc["spec"]["scaling"] = bounds.to_wire()
    assert [(f.code, f.path) for f in validate(doc).errors] == [("ScalingBounds", path)]


def _validated(**scaling):
    doc = example()
    if scaling:
        doc["spec"]["scaling"] = scaling
    validation = validate(doc)
    assert validation.ok, [f.line() for f in validation.errors]
    return validation


def test_the_crd_has_the_scale_subresource_and_the_columns():
    doc = crd(PDROLE)
    names = doc["spec"]["names"]
    assert (doc["metadata"]["name"], names["shortNames"]) == ("pdroles.pd.serving.dev", ["pdr"])
    (version,) = doc["spec"]["versions"]
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {"Deployment": ".spec.deployment", "Role": ".spec.role", "Desired": ".spec.replicas",
                       "Current": ".status.replicas", "Ready": ".status.readyReplicas",
                       "Up-to-date": ".status.updatedReplicas", "Draining": ".status.draining",
                       "Age": ".metadata.creationTimestamp"}
    committed = yaml.safe_load((ROOT / "crds" / PDROLE.file).read_text())
    assert committed == doc, "crds/ is stale: run `make crds`"


def test_one_pdrole_per_role_named_for_it_and_valid_against_its_crd():
    validation = _validated()
    pdroles = [m for m in render(validation.resolved) if m["kind"] == ROLE_KIND]
    assert [(m["metadata"]["name"], m["spec"]) for m in pdroles] == [
        ("glm-flash-prefill", {"deployment": "glm-flash", "role": "prefill", "replicas": 1}),
        ("glm-flash-decode", {"deployment": "glm-flash", "role": "decode", "replicas": 1})]
    for m in pdroles:
        labels = m["metadata"]["labels"]
        assert (labels[DEPLOYMENT], labels[ROLE]) == ("glm-flash", m["spec"]["role"])
        assert schema_problems(m, PDRole) == []
    broken = copy.deepcopy(pdroles[0])
    broken["spec"]["replicas"] = -1
    assert [path for path, _ in schema_problems(broken, PDRole)] == ["spec.replicas"]


def test_the_count_to_run_is_rendered_everywhere():
    validation = with_instances(_validated(), {"prefill": 1, "decode": 3})
    manifests = render(validation.resolved)
    decode_sets = [m["metadata"]["name"] for m in manifests
                   if m["kind"] == "StatefulSet" and m["metadata"]["labels"][ROLE] == "decode"]
    assert decode_sets == ["glm-flash-decode-0", "glm-flash-decode-1", "glm-flash-decode-2"]
    (membership,) = [m for m in manifests
                     if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "glm-flash-proxy"]
    listed = members(membership)
    assert listed is not None and [u.name for u in listed.decode] == decode_sets
    # Each instance its own KV engine id (vllm-ascend asserts one per engine).
    for name in decode_sets:
        (sts,) = [m for m in manifests if m["kind"] == "StatefulSet" and m["metadata"]["name"] == name]
        assert f'default.{name}' in json.dumps(sts)
    assert validation.deployment.spec.decode.replicas == 3
    assert with_instances(validation, {"prefill": 1, "decode": 3}) is validation


def _observed(validation, replicas: int, forwarded: str | None) -> list[dict]:
    owner = {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment",
             "metadata": {"name": "glm-flash", "namespace": "default", "uid": UID}}
    out = []
    for m in render(validation.resolved):
        obj = stamp(pdroles.applied_form(m), owner)
        if pdroles.is_role(obj):
            obj["spec"]["replicas"] = replicas
            if forwarded is not None:
                obj["metadata"]["annotations"][FORWARDED_REPLICAS] = forwarded
        out.append(obj)
    return out


def test_what_the_operator_applies_of_a_pdrole_never_has_replicas():
    validation = _validated()
    (applied,) = [pdroles.applied_form(m) for m in render(validation.resolved) if m["kind"] == ROLE_KIND
                  and m["spec"]["role"] == "decode"]
    assert applied["spec"] == {"deployment": "glm-flash", "role": "decode"}
    # A scaler's spec.replicas (and the forwarded annotation) are no drift: nothing to apply.
    owner = {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment",
             "metadata": {"name": "glm-flash", "namespace": "default", "uid": UID}}
    desired = [stamp(pdroles.applied_form(m), owner) for m in render(validation.resolved)]
    result = diff(desired, _observed(validation, 5, "1"), UID)
    assert result.apply == [] and result.prune == []
    # Created: the applied form plus the count, recorded as forwarded; the hash stays the applied form's.
    created = pdroles.creation(desired[1], 4)
    annotations = created["metadata"]["annotations"]
    assert created["spec"]["replicas"] == 4 and annotations[FORWARDED_REPLICAS] == "4"
    assert annotations[APPLIED_HASH] == desired[1]["metadata"]["annotations"][APPLIED_HASH]


@pytest.mark.parametrize(("observed", "forwarded", "spec", "autoscaled", "want"), [
    (None, None, 2, False, (2, "create")),          # no PDRole yet: created with the spec's count
    (3, "1", 1, False, (3, None)),                  # scaled to 3 since: the PDRole is the truth
    (3, "1", 2, False, (2, "forward")),             # the spec changed since it was forwarded
    (3, "2", 2, False, (3, None)),                  # ... once: the next reconcile finds the levels equal
    (3, "1", 2, True, (3, None)),                   # never while an HPA owns the count
    (3, None, 3, False, (3, "forward")),            # no record of a forward: forward (writes the record)
])
def test_when_the_spec_count_is_forwarded(observed, forwarded, spec, autoscaled, want):
    doc = example()
    doc["spec"]["decode"]["replicas"] = spec
    if autoscaled:
        doc["spec"]["decode"]["autoscaling"] = {
            "maxReplicas": 4, "metrics": [{"metric": "vllm:kv_cache_usage_perc", "averageValue": 0.5}]}
    validation = validate(doc)
    assert validation.ok
    children = [] if observed is None else _observed(validation, observed, forwarded)
    ask = pdroles.asks(validation.resolved, children, UID)["decode"]
    action = "create" if ask.create else "forward" if ask.forward else None
    assert (ask.name, (ask.requested, action)) == ("glm-flash-decode", want)


def test_a_foreign_pdrole_is_neither_read_nor_written():
    validation = _validated()
    children = _observed(validation, 7, None)
    for c in children:
        c["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    ask = pdroles.asks(validation.resolved, children, UID)["decode"]
    assert (ask.requested, ask.create, ask.forward) == (1, False, False)


def test_pdrole_status_reports_the_count_run_and_the_hold():
    dep = _validated().resolved
    held = Hold("decode", MAX_REPLICAS, 5, 2)
    done = RoleFigures("r", 2, 2)
    first = pdroles.status(dep, "decode", 2, RoleFigures("r", 0, 1), 1, held, {}, 4, "2026-01-01T00:00:00Z")
    keys = ("replicas", "readyReplicas", "updatedReplicas", "draining", "selector")
    assert {k: first[k] for k in keys} == {
        "replicas": 2, "readyReplicas": 1, "updatedReplicas": 0, "draining": 1,
        "selector": "pd.serving.dev/deployment=glm-flash,pd.serving.dev/role=decode,"
                    "apps.kubernetes.io/pod-index=0"}
    (cond,) = first["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["observedGeneration"]) == (
        "ScalingLimited", "True", "MaxReplicas", 4)
    assert "PDRole glm-flash-decode" in cond["message"]
    assert "spec.scaling.decode.maxReplicas" in cond["message"]
    later = pdroles.status(dep, "decode", 2, done, 0, held, first, 4, "2026-01-01T00:05:00Z")
    assert later["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    freed = pdroles.status(dep, "decode", 5, done, 0, None, later, 5, "2026-01-01T00:06:00Z")
    assert (freed["conditions"][0]["status"], freed["conditions"][0]["reason"],
            freed["conditions"][0]["lastTransitionTime"]) == ("False", "WithinBounds", "2026-01-01T00:06:00Z")

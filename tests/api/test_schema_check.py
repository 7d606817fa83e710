"""The CRD schema checker: structural errors and CEL rules, on defaulted objects like the API server."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pd_operator.api.schema_check import schema_problems

ROOT = Path(__file__).resolve().parents[2]
GLM = yaml.safe_load((ROOT / "examples" / "glm-5.3-flash-tp8-dp2tp4.yaml").read_text())


def edited(**paths):
    doc = copy.deepcopy(GLM)
    for dotted, value in paths.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


def test_example_passes():
    assert schema_problems(GLM) == []


@pytest.mark.parametrize(("doc", "path", "words"), [
    (edited(spec__prefill__tensorParallelSize="eight"), "spec.prefill.tensorParallelSize", "not of type"),
    (edited(spec__prefill__tensorParallelSize=0), "spec.prefill.tensorParallelSize", "minimum"),
    (edited(spec__decode__typo=1), "spec.decode", "typo"),
    (edited(spec__kvTransfer__protocol="tcp"), "spec.kvTransfer", "protocol"),
    (edited(spec__kvTransfer__timeouts={"transferMs": 60}), "spec.kvTransfer.timeouts.transferMs", "minimum"),
    (edited(spec__decode__hostMounts={"generation": "A4"}), "spec.decode.hostMounts.generation", "A4"),
    (edited(spec__kvTransfer__kvPort=80), "spec.kvTransfer.kvPort", "minimum"),
    (edited(spec__model__hfConfig={"architectures": ["LlamaForCausalLM"]}), "spec.model", "exactly one"),
    (edited(spec__model__weights={"pvc": {"claimName": "a"}, "image": True}), "spec.model.weights",
     "exactly one"),
    (edited(spec__decode__pipelineParallelSize=2), "spec.decode", "pipelineParallelSize must be 1"),
])
def test_problems_name_the_field(doc, path, words):
    problems = schema_problems(doc)
    assert any(p == path and words in m for p, m in problems), problems


def test_cel_sees_defaults_like_the_api_server():
    # pipelineParallelSize is absent on decode: the server defaults it to 1 before the rule runs.
    doc = edited(spec__decode__pipelineParallelSize=None)
    assert schema_problems(doc) == []


def test_cel_rule_per_cache_group_kind():
    kv = {"name": "m", "groups": [{"kind": "mla", "name": "mla", "numLayers": 2, "kvLoraRank": 512,
                                   "headSize": 4}]}
    doc = edited(spec__model__preset=None, spec__model__kv=kv)
    problems = schema_problems(doc)
    assert any(p == "spec.model.kv.groups[0]" and "kind mla does not take" in m for p, m in problems)
    kv["groups"][0].pop("headSize")
    assert schema_problems(edited(spec__model__preset=None, spec__model__kv=kv)) == []


def test_a_document_checked_again_is_answered_from_memory_and_only_the_same_text_is(monkeypatch):
    from pd_operator.api import schema_check

    doc = edited(spec__prefill__tensorParallelSize=0, spec__kvTransfer__kvPort=31017)  # no other test's
    first = schema_problems(doc)
    monkeypatch.setattr(schema_check, "_problems", lambda *args: pytest.fail("checked again"))
    assert schema_problems(copy.deepcopy(doc)) == first
    # Another object of the same manifest, as the API server sends it (a burst of creates, or the
    # same object after a status write): only metadata differs, which the schema does not describe.
    other = copy.deepcopy(doc)
    other["metadata"] = {"name": "another", "namespace": "n", "uid": "u-2", "resourceVersion": "7",
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]}
    assert schema_problems(other) == first
    # Nor status, which the API server drops from writes of the object itself (the status subresource).
    other["status"] = {"conditions": "not a list", "observedGeneration": -1}
    assert schema_problems(other) == first
    first.clear()  # the caller's list is its own
    assert schema_problems(doc) != []
    monkeypatch.undo()
    as_text = edited(spec__prefill__tensorParallelSize="0", spec__kvTransfer__kvPort=31017)  # equal as JSON
    assert [p for p, _ in schema_problems(as_text)] == ["spec.prefill.tensorParallelSize"]
    assert "not of type" in schema_problems(as_text)[0][1]



def test_every_cel_rule_of_the_generated_crd_compiles_up_front():
    from pd_operator.api import schema_check

    def rules(node) -> set[str]:
        if isinstance(node, dict):
            own = {r["rule"] for r in node.get("x-kubernetes-validations", [])}
            return own.union(*(rules(v) for v in node.values()))
        return set().union(*(rules(v) for v in node)) if isinstance(node, list) else set()

    crd_file = Path(__file__).parents[2] / "crds" / "pd.serving.dev_pddeployments.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    written = rules(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    schema_check._program.cache_clear()
    assert len(written) > 10 and schema_check.compile_rules() == len(written)
    assert schema_check._program.cache_info().currsize == len(written)

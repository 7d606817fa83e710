"""The admission verdict: same validator, errors as a rejection naming fields, warnings passed on."""

from __future__ import annotations

from pd_operator.controller.admission import UPDATE_NOTE, verdict
from support.specs import example


def test_compatible_manifest_is_admitted_with_its_warnings():
    v = verdict(example(), "CREATE")
    assert v.allowed and v.message == ""
    assert any(w.startswith("spec.decode.blockSize: ") and "SmallTransferRuns" not in w for w in v.warnings)


def test_incompatible_manifest_is_rejected_naming_the_field():
    v = verdict(example("incompatible-glm-tp8-tp3.yaml"), "CREATE")
    assert not v.allowed
    assert v.message.startswith("spec.decode.tensorParallelSize: ")
    assert "TP 3" in v.message and UPDATE_NOTE not in v.message


def test_rejected_update_says_the_running_deployment_keeps_serving():
    v = verdict(example("incompatible-glm-tp8-tp3.yaml"), "UPDATE")
    assert not v.allowed and v.message.endswith(UPDATE_NOTE)


def test_config_map_model_is_admitted_and_deferred_to_the_controller():
    doc = example()
    doc["spec"]["model"].pop("preset")
    doc["spec"]["model"]["hfConfigMap"] = {"name": "glm-config"}
    v = verdict(doc, "CREATE")
    assert v.allowed
    assert any(w.startswith("spec.model.hfConfigMap: ") and "KVCompatible" in w for w in v.warnings)


def test_garbage_is_rejected_without_a_traceback():
    v = verdict({"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment",
                 "metadata": {"name": "x"}, "spec": {"prefill": "lots"}}, "CREATE")
    assert not v.allowed and "spec" in v.message

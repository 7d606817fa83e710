"""The one validator: every rule reports a code and a field path, and no input makes it raise."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pd_operator.findings import CATALOG
from pd_operator.render.runnable import validate

ROOT = Path(__file__).resolve().parents[2]
GLM = yaml.safe_load((ROOT / "examples" / "glm-5.3-flash-tp8-dp2tp4.yaml").read_text())


def with_changes(changes: dict) -> dict:
    doc = copy.deepcopy(GLM)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[leaf] = value
    return doc


def codes_at(result) -> set[tuple[str, str]]:
    return {(f.code, f.path) for f in result.findings}


def test_example_is_valid_and_resolved():
    result = validate(GLM)
    assert result.ok, [f.line() for f in result.errors]
    assert result.report.prefill_layout.engine_block_size == 640
    assert result.report.decode_layout.engine_block_size == 1152
    assert result.shapes["decode"].dp_local == 2 and result.shapes["decode"].pods == 1


@pytest.mark.parametrize(("changes", "code", "path"), [
    ({"spec.decode.tensorParallelSize": 3}, "HeadsNotDivisibleByTP", "spec.decode.tensorParallelSize"),
    ({"spec.decode.env": [{"name": "VLLM_HOST_IP", "value": "1.2.3.4"}]}, "EnvOverride",
     "spec.decode.env[0]"),
    ({"spec.prefill.extraArgs": ["--enforce-eager", "--block-size=256"]}, "ArgOverride",
     "spec.prefill.extraArgs[1]"),
    ({"spec.prefill.extraArgs": ["-tp", "4"]}, "ArgOverride", "spec.prefill.extraArgs[0]"),
    ({"spec.kvTransfer.kvPort": 20000}, "PortInAscendDirectRange", "spec.kvTransfer.kvPort"),
    ({"spec.kvTransfer.kvPort": 15500}, "PortInHandshakeRange", "spec.kvTransfer.kvPort"),
    ({"spec.kvTransfer.kvPort": 65530}, "PortOutOfRange", "spec.kvTransfer.kvPort"),
    ({"spec.kvTransfer.kvPort": 7996}, "PortOverlap", "spec.servingPort"),
    ({"metadata.name": "a" * 50}, "NameTooLong", "metadata.name"),
    ({"spec.prefill.tensorParallelSize": 16}, "NodeTooSmall", "spec.prefill.tensorParallelSize"),
    ({"spec.decode.dataParallelSize": 3, "spec.decode.npusPerNode": 8}, "NodeTooSmall",
     "spec.decode.dataParallelSize"),
    ({"spec.decode.hostNetwork": True}, "HostNetworkNotAllowed", "spec.decode.hostNetwork"),
    ({"spec.kvTransfer.connector": "MooncakeConnectorV1", "spec.decode.kernelBlockSize": 256},
     "CrossTPBlockSizesUnsupported", "spec.kvTransfer.connector"),
    ({"spec.model.kvCacheDtype": "float16"}, "KVCacheDTypeIncompatible", "spec.model.kvCacheDtype"),
    ({"spec.prefill.extraArgs": ["--enable-prefix-caching"]}, "ArgOverride", "spec.prefill.extraArgs[0]"),
    ({"spec.decode.extraArgs": ["--no-enable-prefix"]}, "ArgOverride", "spec.decode.extraArgs[0]"),
    ({"spec.prefill.blockSize": 4096, "spec.model.kvCacheDtype": "int8"}, "RequestedBlockLowered",
     "spec.prefill.blockSize"),
    ({"spec.model.preset": "no-such-model"}, "UnknownModel", "spec.model.preset"),
    ({"spec.decode.numSpeculativeTokens": 1}, "StateShapeMismatch", "spec.decode.numSpeculativeTokens"),
    ({"spec.prefill.replicas": "two"}, "InvalidSpec", "spec.prefill.replicas"),
    ({"spec.proxy.routing.prefix": "precise", "spec.prefill.enablePrefixCaching": False},
     "PrefixRoutingUnusable", "spec.proxy.routing.prefix"),
    ({"spec.proxy.routing.prefix": "precise", "spec.proxy.enabled": False}, "PrefixRoutingUnusable",
     "spec.proxy.routing.prefix"),
    ({"spec.proxy.routing.prefix": "precise", "spec.proxy.routing.kvEventsPort": 8000}, "PortOverlap",
     "spec.servingPort"),
    ({"spec.proxy.routing.prefix": "precise", "spec.proxy.routing.kvEventsPort": 15600},
     "PortInHandshakeRange", "spec.proxy.routing.kvEventsPort"),
    ({"spec.proxy.routing.prefix": "off", "spec.proxy.routing.prefillCacheBlocks": 10}, "InvalidSpec",
     "spec.proxy.routing"),
    ({"spec.proxy.routing.prefix": "exact"}, "InvalidSpec", "spec.proxy.routing.prefix"),
    ({"spec.prefill.extraArgs": ["--kv-events-config={}"]}, "ArgOverride", "spec.prefill.extraArgs[0]"),
    ({"kind": "Deployment"}, "InvalidSpec", "kind"),
])
def test_rule_reports_code_and_path(changes, code, path):
    result = validate(with_changes(changes))
    assert (code, path) in codes_at(result), [f.line() for f in result.findings]
    finding = next(f for f in result.findings if f.code == code)
    assert finding.severity == CATALOG[code][0]
    assert finding.message.endswith(".") and len(finding.message) > 30


def test_a_float16_kv_cache_on_a_bf16_model_is_refused_with_vllms_words():
    result = validate(with_changes({"spec.model.kvCacheDtype": "float16"}))
    assert not result.ok
    (finding,) = [f for f in result.errors if f.code == "KVCacheDTypeIncompatible"]
    assert finding.path == "spec.model.kvCacheDtype"
    assert 'kv_cache_dtype="float16" is incompatible with dtype="bfloat16"' in finding.message


def test_int8_kv_cache_gives_vllm_ascends_c8_blocks():
    result = validate(with_changes({"spec.model.kvCacheDtype": "int8"}))
    assert result.ok, [f.line() for f in result.errors]
    assert (result.report.prefill_layout.engine_block_size, result.report.decode_layout.engine_block_size) \
        == (1152, 2176)


def test_prefix_caching_flags_are_free_for_models_without_state():
    """Where spec.prefill.enablePrefixCaching is not set, a model without state renders neither flag."""
    doc = with_changes({"spec.prefill.extraArgs": ["--enable-prefix-caching"]})
    doc["spec"]["model"]["preset"] = "llama-3.1-8b"
    del doc["spec"]["prefill"]["enablePrefixCaching"]
    assert "ArgOverride" not in {f.code for f in validate(doc).findings}


def test_prefix_caching_flags_are_owned_where_the_field_renders_them():
    doc = with_changes({"spec.prefill.extraArgs": ["--no-enable-prefix-caching"],
                        "spec.prefill.enablePrefixCaching": True})
    doc["spec"]["model"]["preset"] = "llama-3.1-8b"
    result = validate(doc)
    (finding,) = [f for f in result.errors if f.code == "ArgOverride"]
    assert finding.path == "spec.prefill.extraArgs[0]"
    assert "spec.prefill.enablePrefixCaching" in finding.message


def test_glm_prefix_caching_needs_chunked_prefill():
    refused = validate(with_changes({"spec.prefill.extraArgs": ["--no-enable-chunked-prefill"]}))
    assert ("PrefixCachingNeedsChunkedPrefill", "spec.prefill.extraArgs[0]") in codes_at(refused)
    assert "Chunked prefill is required for Mamba prefix caching." in refused.errors[0].message
    # Decode does not cache prefixes in the example: chunked prefill is its own business there.
    assert validate(with_changes({"spec.decode.extraArgs": ["--no-enable-chunked-prefill"]})).ok


def test_v1_with_mtp_refuses_prefix_caching_on_prefill_only():
    changes = {"spec.kvTransfer.connector": "MooncakeConnectorV1", "spec.decode.tensorParallelSize": 8,
               "spec.decode.dataParallelSize": 1, "spec.prefill.numSpeculativeTokens": 1,
               "spec.decode.numSpeculativeTokens": 1}
    result = validate(with_changes(changes))
    assert ("PrefixCachingModeMismatch", "spec.decode.enablePrefixCaching") in codes_at(result)
    assert not result.ok and result.resolved is None
    both = validate(with_changes({**changes, "spec.decode.enablePrefixCaching": True}))
    assert both.ok, [f.line() for f in both.errors]
    assert validate(with_changes({**changes, "spec.kvTransfer.connector": "MooncakeConnectorV2"})).ok


def test_hf_config_map_is_deferred_without_a_reader_and_resolved_with_one():
    doc = with_changes({"spec.model.hfConfigMap": {"name": "llama-config"}})
    del doc["spec"]["model"]["preset"]
    deferred = validate(doc)
    assert [f.code for f in deferred.findings] == ["KVCheckDeferred"] and deferred.report is None
    missing = validate(doc, read_config_map=lambda name, key: None)
    assert ("ConfigMapNotFound", "spec.model.hfConfigMap") in codes_at(missing) and not missing.ok
    config = (ROOT / "tests" / "api" / "llama-3.1-8b.config.json").read_text()
    resolved = validate(doc, read_config_map=lambda name, key: config if (name, key) ==
                        ("llama-config", "config.json") else None)
    assert resolved.ok and resolved.model.groups[0].num_kv_heads == 8


def test_unsupported_architecture_names_the_config():
    doc = with_changes({"spec.model.hfConfig": {"architectures": ["MambaForCausalLM"]}})
    del doc["spec"]["model"]["preset"]
    result = validate(doc)
    assert ("UnsupportedArchitecture", "spec.model.hfConfig") in codes_at(result)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)

FIELDS = ["spec.prefill.tensorParallelSize", "spec.decode.dataParallelSize", "spec.model.preset",
          "spec.kvTransfer.kvPort", "spec.decode.blockSize", "spec.prefill.env", "spec.model.kv",
          "spec.decode.extraArgs", "metadata.name", "spec.proxy", "spec.model.weights", "spec",
          "spec.kvTransfer.timeouts", "spec.decode.hostMounts", "spec.prefill.npusPerNode",
          "spec.decode.kernelBlockSize"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=json_values)
def test_any_value_anywhere_gives_findings_not_tracebacks(field, value):
    result = validate(with_changes({field: value}))
    for finding in result.findings:
        assert finding.code in CATALOG
        assert finding.severity != "error" or finding.path, finding
    if not result.ok:
        assert result.errors


@settings(max_examples=60, deadline=None)
@given(doc=json_values)
def test_arbitrary_documents_are_rejected_with_a_path(doc):
    result = validate(doc)
    assert not result.ok and all(f.path for f in result.errors)

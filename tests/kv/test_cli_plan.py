"""`pdctl plan|validate|models`: exit codes, one-line errors, the JSON contract and its byte count."""

from __future__ import annotations

import json
from math import ceil
from pathlib import Path

import pytest

from pd_operator import cli

HF_CONFIGS = Path(__file__).parent / "hf_configs"
GLM_WHAT_IF = ["plan", "--model", "glm-5.3-flash", "--prefill-tp", "8",
               "--decode-tp", "4", "--decode-dp", "2"]

MANIFEST = """\
apiVersion: pd.serving.dev/v1alpha1
kind: PDDeployment
metadata:
  name: glm-flash
spec:
  model:
    name: /models/GLM-5.3-Flash
    preset: glm-5.3-flash
    weights:
      image: true
  image:
    name: quay.io/ascend/vllm-ascend:v0.30.0rc2
  kvTransfer:
    connector: MooncakeConnectorV2
  prefill:
    tensorParallelSize: 8
  decode:
    tensorParallelSize: {decode_tp}
    dataParallelSize: 2
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_exit(capsys, *argv: str) -> tuple[int, str, str]:
    """Like run(), for input that argparse itself rejects (it exits)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def manifest(tmp_path: Path, decode_tp: int = 4, name: str = "pdd.yaml") -> str:
    path = tmp_path / name
    path.write_text(MANIFEST.format(decode_tp=decode_tp))
    return str(path)


def test_plan_compatible_exits_0_with_a_table(capsys):
    code, out, _ = run(capsys, *GLM_WHAT_IF)
    assert code == cli.EXIT_OK
    assert "verdict: COMPATIBLE" in out
    assert "engine block (tokens)" in out and "640" in out and "1152" in out
    assert "naive per-segment plan" in out


def test_plan_json_has_exactly_the_documented_keys(capsys):
    code, out, _ = run(capsys, *GLM_WHAT_IF, "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"compatible", "findings", "prefill", "decode", "transfer"}
    for finding in data["findings"]:
        assert set(finding) == {"code", "severity", "path", "group", "message"}
    for role in ("prefill", "decode"):
        side = data[role]
        assert set(side) == {"tensorParallelSize", "dataParallelSize", "engineBlockSize", "cacheGroups",
                             "prefixCaching"}
        assert set(side["prefixCaching"]) == {"enabled", "hitTokens", "mambaCacheMode", "stateBlockSize",
                                              "stateSlotsPerRequest", "stateBytesPerRequest",
                                              "tokenBytesPerBlock"}
        for group in side["cacheGroups"]:
            per = "bytesPerRequest" if group["kind"] in ("state", "indexerTail") else "bytesPerToken"
            assert set(group) == {"name", "kind", "replicated", per, "pageBytes"}
    assert set(data["transfer"]) == {"segmentTokens", "promptTokens", "entries", "bytes", "perDecodeRank",
                                     "perPrefillRank"}
    for row in data["transfer"]["perPrefillRank"]:
        assert set(row) == {"rank", "bytes", "groups"}
    assert (data["prefill"]["engineBlockSize"], data["decode"]["engineBlockSize"]) == (640, 1152)
    assert (data["decode"]["tensorParallelSize"], data["decode"]["dataParallelSize"]) == (4, 2)
    assert data["transfer"]["segmentTokens"] == 128


def test_prefix_caching_on_prefill_keeps_the_blocks_and_costs_one_more_state_slot(capsys):
    """vLLM's align mode on GLM-5.3-Flash: the same 640-token engine block (vllm-ascend's pooled rule has no
    checkpoint alignment), state blocks of 640 tokens, hits on 640-token boundaries, two state slots per
    running request instead of one, and the transfer unchanged."""
    code, out, _ = run(capsys, *GLM_WHAT_IF, "-o", "json")
    off = json.loads(out)
    code_on, out, _ = run(capsys, *GLM_WHAT_IF, "--prefill-enable-prefix-caching", "-o", "json")
    on = json.loads(out)
    assert code == code_on == 0
    assert off["prefill"]["prefixCaching"]["enabled"] is False
    assert off["prefill"]["prefixCaching"]["hitTokens"] is None
    prefill, decode = on["prefill"]["prefixCaching"], on["decode"]["prefixCaching"]
    assert (on["prefill"]["engineBlockSize"], on["decode"]["engineBlockSize"]) == (640, 1152)
    assert prefill == {**off["prefill"]["prefixCaching"], "enabled": True, "hitTokens": 640,
                       "mambaCacheMode": "align", "stateBlockSize": 640, "stateSlotsPerRequest": 2,
                       "stateBytesPerRequest": 2 * off["prefill"]["prefixCaching"]["stateBytesPerRequest"]}
    # One TP8 rank's 34 KDA layers, each slot padded to one 640-token MLA page (640 x 1024 bytes).
    assert off["prefill"]["prefixCaching"]["stateBytesPerRequest"] == 34 * 640 * 1024
    assert decode == off["decode"]["prefixCaching"] and decode["mambaCacheMode"] == "none"
    assert on["transfer"] == off["transfer"]


def test_prefix_caching_flag_for_both_roles_and_its_default(capsys):
    _, out, _ = run(capsys, *GLM_WHAT_IF, "--enable-prefix-caching", "--no-decode-enable-prefix-caching",
                    "-o", "json")
    data = json.loads(out)
    assert [data[role]["prefixCaching"]["enabled"] for role in ("prefill", "decode")] == [True, False]
    # A model without state caches prefixes unless told not to, as vLLM does; its hits land on its block.
    _, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", "-o", "json")
    llama = json.loads(out)["prefill"]
    assert llama["prefixCaching"]["enabled"]
    assert llama["prefixCaching"]["hitTokens"] == llama["engineBlockSize"]
    assert llama["prefixCaching"]["mambaCacheMode"] == "none"


def test_v1_with_mtp_refuses_prefix_caching_on_one_role_only(capsys):
    code, out, _ = run(capsys, *GLM_WHAT_IF, "--connector", "MooncakeConnectorV1", "--decode-tp", "8",
                       "--num-speculative-tokens", "1", "--prefill-enable-prefix-caching", "-o", "json")
    assert code == 1
    (finding,) = [f for f in json.loads(out)["findings"] if f["code"] == "PrefixCachingModeMismatch"]
    assert finding["path"] == "--decode-enable-prefix-caching" and finding["group"] == "kda"
    assert "Invalid non-aligned Mamba state block metadata" in finding["message"]
    code, out, _ = run(capsys, *GLM_WHAT_IF, "--connector", "MooncakeConnectorV1", "--decode-tp", "8",
                       "--num-speculative-tokens", "1", "--enable-prefix-caching", "-o", "json")
    assert code == 0, out
    # MooncakeConnectorV2 finds the state block by position whatever the modes.
    code, out, _ = run(capsys, *GLM_WHAT_IF, "--num-speculative-tokens", "1",
                       "--prefill-enable-prefix-caching", "-o", "json")
    assert code == 0 and "PrefixCachingModeMismatch" not in out


def test_one_tp8_prefill_rank_sends_the_seeds_18_5_mb_of_kda_state(capsys):
    """The seed's "~18.5 MB transferred per request" (P=TP8 -> D=DP2xTP4) is one TP8 prefill rank's KDA
    state over the 34 KDA layers: 34 x (8 x 128 x 128 x 4 + 3 x 8 x 128 x 3 x 2) bytes."""
    code, out, _ = run(capsys, *GLM_WHAT_IF, "-o", "json")
    assert code == 0
    senders = json.loads(out)["transfer"]["perPrefillRank"]
    assert [r["rank"] for r in senders] == list(range(8))
    assert {r["groups"]["kda"] for r in senders} == {34 * (8 * 128 * 128 * 4 + 3 * 8 * 128 * 3 * 2)} \
        == {18_452_480}
    code, table, _ = run(capsys, *GLM_WHAT_IF)
    assert "sent per prefill rank" in table and "kda 18,452,480" in table


@pytest.mark.parametrize("prompt", [1, 10_000, 131_072])
def test_transfer_bytes_match_an_independent_count(capsys, prompt):
    """One decode instance (TP4) pulls, summed over its ranks: the whole MLA latent, compressed indexer
    and indexer tail on every rank (replicated), and its quarter of the KDA state, unpadded."""
    code, out, _ = run(capsys, *GLM_WHAT_IF, "--prompt-tokens", str(prompt), "-o", "json")
    assert code == 0
    transfer = json.loads(out)["transfer"]
    mla = 11 * prompt * 512 * 2
    indexer = 11 * ceil(prompt / 4) * 128 * 2
    tail = 11 * 2 * 4 * 128 * 4
    kda_per_rank = 34 * (64 * 128 * 128 * 4 + 3 * 64 * 128 * 3 * 2) // 4
    assert transfer["bytes"] == 4 * (mla + indexer + tail + kda_per_rank)
    senders = transfer["perPrefillRank"]
    assert sum(r["bytes"] for r in senders) == transfer["bytes"]
    assert {r["groups"]["kda"] for r in senders} == {kda_per_rank // 2}
    assert transfer["promptTokens"] == prompt
    ranks = transfer["perDecodeRank"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert sum(r["bytes"] for r in ranks) == transfer["bytes"]
    assert sum(r["entries"] for r in ranks) == transfer["entries"]


def test_plan_with_errors_exits_1_and_names_the_flag(capsys):
    code, out, _ = run(capsys, "plan", "--model", "glm-5.3-flash", "--prefill-tp", "8", "--decode-tp", "3",
                       "-o", "json")
    assert code == cli.EXIT_FINDINGS
    data = json.loads(out)
    assert not data["compatible"] and data["transfer"] is None
    found = sorted((f["code"], f["path"], f["group"]) for f in data["findings"])
    # vLLM's own check on the 64 attention heads, and the KDA state that cannot be split over 3 ranks.
    assert found == [("HeadsNotDivisibleByTP", "--decode-tp", ""),
                     ("HeadsNotDivisibleByTP", "--decode-tp", "kda")]


@pytest.mark.parametrize(("flags", "code", "path"), [
    (["--decode-pp", "2"], "DecodePipelineParallel", "--decode-pp"),
    (["--decode-model", "llama-3.1-8b"], "ModelMismatch", "--decode-model"),
    (["--decode-block-size", "130", "--kernel-block-size", "2", "--platform", "vllm"],
     "BlockNotDivisibleByCompressRatio", "--decode-block-size"),
    (["--kv-cache-dtype", "float16"], "KVCacheDTypeIncompatible", "--kv-cache-dtype"),
    (["--kv-cache-dtype", "int8", "--platform", "vllm"], "KVCacheDTypeUnsupported", "--kv-cache-dtype"),
    (["--kv-cache-dtype", "fp8", "--decode-model", "deepseek-v3.2"], "ModelMismatch", "--decode-model"),
])
def test_what_if_findings_name_the_flag(capsys, flags, code, path):
    exit_code, out, _ = run(capsys, *GLM_WHAT_IF, *flags, "-o", "json")
    assert exit_code == cli.EXIT_FINDINGS
    assert (code, path) in {(f["code"], f["path"]) for f in json.loads(out)["findings"]}


def test_warning_only_plan_exits_0(capsys):
    code, out, _ = run(capsys, *GLM_WHAT_IF, "-o", "json")
    severities = {f["severity"] for f in json.loads(out)["findings"]}
    assert code == 0 and "warning" in severities and "error" not in severities


def test_plan_from_an_hf_config(capsys):
    config = HF_CONFIGS / "qwen3-next-80b-a3b-instruct" / "config.json"
    code, out, _ = run(capsys, "plan", "--model-config", str(config), "--prefill-tp", "4", "--decode-tp", "2",
                       "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert (data["prefill"]["engineBlockSize"], data["decode"]["engineBlockSize"]) == (384, 640)


def test_plan_from_a_manifest(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", manifest(tmp_path), "-o", "json")
    assert code == 0
    assert json.loads(out)["decode"]["engineBlockSize"] == 1152


@pytest.mark.parametrize(("argv", "message"), [
    (["plan", "/nonexistent/pdd.yaml"], "/nonexistent/pdd.yaml: cannot read"),
    (["plan", "--model", "gpt-7"], "unknown model preset 'gpt-7'"),
    (["plan", "--model-config", "/nonexistent/config.json"], "/nonexistent/config.json: cannot read"),
    (["plan"], "give a manifest FILE"),
])
def test_unreadable_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == cli.EXIT_UNREADABLE and out == ""
    assert message in one_line_error(err)


def test_bad_yaml_exits_2(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("kind: PDDeployment\nspec: [unclosed\n")
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2 and "not valid YAML" in one_line_error(err)


def test_yaml_without_a_pddeployment_exits_2(capsys, tmp_path):
    path = tmp_path / "cm.yaml"
    path.write_text("kind: ConfigMap\n")
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2 and "no PDDeployment" in one_line_error(err)


def test_bad_json_config_exits_2(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["LlamaForCausalLM"],')
    code, _, err = run(capsys, "plan", "--model-config", str(path))
    assert code == 2 and str(path) in one_line_error(err)


def test_config_missing_a_key_exits_2_naming_it(capsys, tmp_path):
    path = tmp_path / "config.json"
    cfg = json.loads((HF_CONFIGS / "deepseek-v3.2-exp" / "config.json").read_text())
    del cfg["index_head_dim"]  # DeepseekV3Config has no default for it; vLLM's indexer reads it bare
    path.write_text(json.dumps(cfg))
    code, _, err = run(capsys, "plan", "--model-config", str(path))
    assert code == 2 and "'index_head_dim'" in one_line_error(err)


@pytest.mark.parametrize(("flags", "message"), [
    (["--kv-cache-dtype", "float4"], "invalid choice: 'float4'"),
    (["--decode-tp", "0"], "--decode-tp: 0 must be at least 1"),
    (["--prompt-tokens", "many"], "'many' is not an integer"),
])
def test_bad_flags_exit_2_with_one_line(capsys, flags, message):
    code, out, err = run_exit(capsys, *GLM_WHAT_IF, *flags)
    assert code == 2 and out == ""
    assert message in one_line_error(err)


def test_bad_dtype_in_an_hf_config_exits_2(capsys, tmp_path):
    cfg = json.loads((HF_CONFIGS / "llama-3.1-8b" / "config.json").read_text())
    cfg["torch_dtype"] = "float4"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, _, err = run(capsys, "plan", "--model-config", str(path))
    assert code == 2 and "'torch_dtype' is 'float4'" in one_line_error(err)


def test_validate_exit_codes(capsys, tmp_path):
    good, bad = manifest(tmp_path, 4, "good.yaml"), manifest(tmp_path, 3, "bad.yaml")
    code, out, _ = run(capsys, "validate", good)
    assert code == 0 and f"{good} (glm-flash): valid" in out
    code, out, _ = run(capsys, "validate", good, bad)
    assert code == 1 and f"{bad} (glm-flash): invalid" in out and "HeadsNotDivisibleByTP" in out
    code, out, err = run(capsys, "validate", good, bad, str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml: cannot read" in one_line_error(err)
    assert f"{good} (glm-flash): valid" in out and f"{bad} (glm-flash): invalid" in out


def test_models_lists_the_presets_and_their_block_sizes(capsys):
    code, out, _ = run(capsys, "models", "-o", "json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) == {"deepseek-v3.2", "glm-5.3-flash", "llama-3.1-8b", "qwen3-next-80b-a3b"}
    assert rows["glm-5.3-flash"]["engineBlockSize"] == {"1": 4352, "2": 2176, "4": 1152, "8": 640}
    code, out, _ = run(capsys, "models")
    assert code == 0 and "4352/2176/1152/640" in out


def test_the_glm_example_prints_what_each_prefill_rank_sends(capsys):
    example = Path(__file__).parents[2] / "examples" / "glm-5.3-flash-tp8-dp2tp4.yaml"
    code, out, _ = run(capsys, "plan", str(example))
    assert code == 0
    lines = out.splitlines()
    start = lines.index("sent per prefill rank (bytes):")
    senders = lines[start + 1:start + 9]
    assert [line.split(":")[0].strip() for line in senders] == [f"prefill rank {r}" for r in range(8)]
    assert all("kda 18,452,480" in line for line in senders)

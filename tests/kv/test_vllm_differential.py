"""Differential test: `pdctl`'s reading and verdict on generated config.json files against vLLM 0.34's own
config classes and start-up code.

A seeded generator writes configs of every architecture in `hf_config.SUPPORTED_ARCHITECTURES` with random
head counts and dims, conv kernels and layer mixes, then leaves keys out as real checkpoints do: each key in
turn, then random combinations. The keys it leaves out are the fields of the config class vLLM builds for
the config's `model_type`, introspected in `.vllm-venv` (`support/vllm_venv/config_fields.py`), not listed
here; a config fails the test if the reader reads a key outside that list. Each config is one side on plain
vLLM (`platform="vllm"`) with a random TP, kernel block, requested block, KV cache dtype and draft tokens.
vLLM's verdict comes from `support/vllm_venv/block_alignment.py` (ModelConfig reading the config.json,
VllmConfig and its checks, `Platform.update_block_size_for_backend`, the model class's state shapes), ours
from `check_pair` on the same config.json, with the model dtype the operator renders (`--dtype`). The
contract:

- whatever pdctl approves, vLLM accepts, with the same engine block, attention bytes per token, state bytes
  per request and layer of each kind (`wrong_approvals`, `size_mismatches`);
- whatever vLLM refuses, pdctl refuses;
- pdctl may refuse more (`extra_refusals` otherwise) only for a failure that comes after vLLM's config code:
  the worker's kernel-block split, a pooled indexer entry cut by a block, state heads that do not divide
  over TP (vLLM's state-shape code splits conv channels, so its config passes; its layers then split heads
  with integer division, `num_k_heads // tp_size` in qwen_gdn_linear_attn.py, and the connector moves whole
  heads), and a key vLLM's config object holds no value for, which its model code reads bare (DeepSeek-V3.2's
  `config.index_head_dim`; Kimi Linear's `assert kv_lora_rank is not None`).

GLM-5.3-Flash is served by vllm-ascend, which registers its own config classes for it; its model classes
need torch_npu (and vLLM's own Glm5Next classes need torchvision), so its configs are checked at the config
level: vLLM's config loading (`get_config`) with vllm-ascend 0.30.0rc2's `patch_glm5next_config.py` applied
from its source archive resolves the keys, and our description of the generated config must equal our
description of an explicit config holding those resolved values. Its block sizes are checked against
vllm-ascend's own rule in test_vllm_blocksize.py.

All cases run in one probe process; the counts are printed (`pytest -s` shows them).

With prefix caching on both roles (vLLM's "align" state cache mode for hybrid models), a second seeded draw
of the same generator holds the same contract, and what the blocks cost must match vLLM's own classes too:
the state cache mode, the state block (`mamba_block_size`), the state blocks a running request holds and
where prefix-cache hits land (`cost_mismatches`).
"""

from __future__ import annotations

import json
import random
import subprocess
from collections import Counter
from collections.abc import Callable

import pytest

from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.compat import check_pair
from pd_operator.kv.hf_config import (
    CONFIG_CLASSES,
    DERIVED,
    REQUIRED,
    SUPPORTED_ARCHITECTURES,
    ConfigError,
    model_from_hf_config,
    resolved_keys,
)
from pd_operator.kv.side import Side
from support.vllm_tier import VLLM_PYTHON, ascend_src, hf_config, run_probe, vllm_venv_program

pytestmark = pytest.mark.vllm

SEED = 20261203
PREFIX_CACHING_SEED = 20261236
FULL = 60
"""Configs with every key given (random shapes); the rest leave keys out."""
RANDOM_DROPS = 340
"""Configs leaving a random combination of keys out, on top of one config per key left out alone."""
# Refusals of ours for failures after vLLM's config code (see the module docstring).
LATER_CODES = frozenset({"BlockSizeNotKernelAligned", "BlockNotDivisibleByCompressRatio"})
NOT_DROPPED = frozenset({"architectures", "model_type"})
"""What selects the class itself."""


def pick(rng: random.Random, options):
    return rng.choice(list(options))


def attention_config(arch: str, model_type: str, head_dim: bool) -> Callable[[random.Random], dict]:
    def build(rng: random.Random) -> dict:
        heads = pick(rng, (8, 16, 32, 64))
        cfg = {"architectures": [arch], "model_type": model_type, "num_hidden_layers": pick(rng, (2, 4, 8)),
               "num_attention_heads": heads, "hidden_size": heads * pick(rng, (64, 96, 128)),
               "num_key_value_heads": pick(rng, [h for h in (1, 2, 4, 8, 16) if h <= heads]),
               "intermediate_size": 1024, "vocab_size": 1024}
        if head_dim:
            cfg["head_dim"] = pick(rng, (64, 128, 256))
        return cfg
    return build


def deepseek_config(arch: str, model_type: str, indexer: bool) -> Callable[[random.Random], dict]:
    def build(rng: random.Random) -> dict:
        cfg = {"architectures": [arch], "model_type": model_type, "num_hidden_layers": pick(rng, (2, 4)),
               "num_attention_heads": pick(rng, (16, 32, 64, 128)), "hidden_size": 1024,
               "kv_lora_rank": pick(rng, (128, 256, 512)), "qk_rope_head_dim": pick(rng, (32, 64)),
               "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": 512, "intermediate_size": 1024,
               "vocab_size": 1024}
        if indexer:
            cfg.update(index_head_dim=pick(rng, (64, 128)), index_n_heads=16, index_topk=256)
        return cfg
    return build


def qwen3_next(rng: random.Random) -> dict:
    heads = pick(rng, (4, 8, 16, 32))
    key_heads = pick(rng, (4, 8, 16))
    return {**hf_config("qwen3-next-80b-a3b-instruct"), "num_hidden_layers": 8, "full_attention_interval": 4,
            "num_attention_heads": heads,
            "num_key_value_heads": pick(rng, [h for h in (1, 2, 4, 8) if h <= heads]),
            "head_dim": pick(rng, (64, 128, 256)), "linear_num_key_heads": key_heads,
            "linear_num_value_heads": key_heads * pick(rng, (1, 2)),
            "linear_key_head_dim": pick(rng, (64, 128)), "linear_value_head_dim": pick(rng, (64, 128)),
            "linear_conv_kernel_dim": pick(rng, (2, 3, 4))}


def kimi_linear(rng: random.Random) -> dict:
    base = hf_config("kimi-linear-48b-a3b-instruct")
    return {**base, "num_hidden_layers": 8, "first_k_dense_replace": 1,
            "num_attention_heads": pick(rng, (16, 32, 64)), "kv_lora_rank": pick(rng, (128, 256, 512)),
            "qk_rope_head_dim": pick(rng, (0, 64)),
            "linear_attn_config": {**base["linear_attn_config"], "kda_layers": [1, 2, 3, 5, 6, 7],
                                   "full_attn_layers": [4, 8], "num_heads": pick(rng, (8, 16, 32, 64)),
                                   "head_dim": pick(rng, (64, 128)),
                                   "short_conv_kernel_size": pick(rng, (2, 3, 4))}}


def glm5_next_text(rng: random.Random) -> dict:
    """GLM-5.3-Flash's 45 layers (its per-layer lists are checked against num_hidden_layers)."""
    text = {**hf_config("glm-5.3-flash")["text_config"], "index_kpool": pick(rng, (4, 8, 16)),
            "num_nextn_predict_layers": pick(rng, (0, 1))}
    text["layer_types"] = pick(rng, (None, ["linear_attention"] * 40 + ["indexed_attention"] * 5))
    kda = {"num_heads": pick(rng, (16, 32, 64)), "head_dim": pick(rng, (64, 128)),
           "short_conv_kernel_size": pick(rng, (2, 4))}
    text["linear_attn_config"] = pick(rng, (kda, {k: v for k, v in kda.items() if k != "head_dim"}))
    text.update(linear_num_heads=pick(rng, (32, 64)), linear_head_dim=pick(rng, (64, 128)),
                linear_conv_kernel_dim=pick(rng, (3, 4)))
    return {k: v for k, v in text.items() if v is not None}


def glm5_next_flat(rng: random.Random) -> dict:
    return {**glm5_next_text(rng), "architectures": ["Glm5NextForCausalLM"], "model_type": "glm5_next"}


def glm5_next_nested(rng: random.Random) -> dict:
    top = hf_config("glm-5.3-flash")
    return {**top, "text_config": glm5_next_text(rng)}


GENERATORS: dict[str, Callable[[random.Random], dict]] = {
    "LlamaForCausalLM": attention_config("LlamaForCausalLM", "llama", True),
    "MistralForCausalLM": attention_config("MistralForCausalLM", "mistral", True),
    "MixtralForCausalLM": attention_config("MixtralForCausalLM", "mixtral", True),
    "Qwen2ForCausalLM": attention_config("Qwen2ForCausalLM", "qwen2", False),
    "Qwen2MoeForCausalLM": attention_config("Qwen2MoeForCausalLM", "qwen2_moe", False),
    "Qwen3ForCausalLM": attention_config("Qwen3ForCausalLM", "qwen3", True),
    "Qwen3MoeForCausalLM": attention_config("Qwen3MoeForCausalLM", "qwen3_moe", True),
    "DeepseekV2ForCausalLM": deepseek_config("DeepseekV2ForCausalLM", "deepseek_v2", False),
    "DeepseekV3ForCausalLM": deepseek_config("DeepseekV3ForCausalLM", "deepseek_v3", False),
    "DeepseekV32ForCausalLM": deepseek_config("DeepseekV32ForCausalLM", "deepseek_v32", True),
    "Qwen3NextForCausalLM": qwen3_next,
    "KimiLinearForCausalLM": kimi_linear,
    "Glm5NextForCausalLM": glm5_next_flat,
    "Glm5NextForConditionalGeneration": glm5_next_nested,
}
HYBRID = ("Qwen3NextForCausalLM", "KimiLinearForCausalLM")


@pytest.fixture(scope="module")
def classes() -> dict:
    """model_type -> the config class vLLM builds for it, introspected; and the checked citations of the
    keys vLLM's model code reads that are not the class's fields."""
    citations = [[mt, key, where.split(": ", 1)[1].split(",")[0]] for mt, table in CONFIG_CLASSES.items()
                 for key, where in table.model_code_keys.items()]
    done = subprocess.run([str(VLLM_PYTHON), str(vllm_venv_program("config_fields.py"))], capture_output=True,
                          text=True, timeout=600, input=json.dumps({"modelTypes": sorted(CONFIG_CLASSES),
                                                                     "citations": citations,
                                                                     "ascendSrc": str(ascend_src())}))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    unfound = [c for c in out["citations"] if not c[3]]
    assert not unfound, f"cited vLLM sources do not read these keys: {unfound}"
    return out["classes"]


def known_keys(classes: dict, model_type: str) -> set[str]:
    return set(classes[model_type]["fields"]) | set(CONFIG_CLASSES[model_type].model_code_keys)


def test_defaults_table_is_the_config_classes(classes):
    """Each default the reader applies is the class's own: the class vLLM resolves, its value with no key
    given; a key with no default holds none there; every key read is a field or a cited model-code key."""
    for model_type, table in CONFIG_CLASSES.items():
        got = classes[model_type]
        assert got["class"] == table.name, model_type
        for key, default in table.defaults.items():
            assert key in known_keys(classes, model_type), (model_type, key)
            if key in table.model_code_keys:
                continue
            if default is REQUIRED:
                assert got["defaults"].get(key) is None, (model_type, key)
            elif default is not DERIVED:
                assert got["defaults"][key] == default, (model_type, key)


def droppable(config: dict, classes: dict) -> tuple[dict, list[str]]:
    """(the object whose keys are left out, those keys): the text config's own when nested."""
    model_type = config["model_type"]
    target = config.get("text_config", config)
    text_type = "glm5_next" if "text_config" in config else model_type
    return target, sorted(set(target) & known_keys(classes, text_type) - NOT_DROPPED)


def without(config: dict, keys: list[str]) -> dict:
    if "text_config" in config:
        return {**config, "text_config": {k: v for k, v in config["text_config"].items() if k not in keys}}
    return {k: v for k, v in config.items() if k not in keys}


def generated(classes: dict, seed: int = SEED, only: tuple[str, ...] = ()) -> list[dict]:
    """Configs of every architecture, or of the `only` ones."""
    rng = random.Random(seed)
    archs = sorted(only or GENERATORS)
    configs = [(GENERATORS[a](rng), []) for a in (archs * (FULL // len(archs) + 1))[:FULL]]
    for arch in archs:  # every key left out alone
        base = GENERATORS[arch](rng)
        configs += [(without(base, [key]), [key]) for key in droppable(base, classes)[1]]
    for _ in range(RANDOM_DROPS):
        base = GENERATORS[pick(rng, archs + list(HYBRID))](rng)
        keys = droppable(base, classes)[1]
        dropped = rng.sample(keys, rng.randint(2, min(6, len(keys))))
        configs.append((without(base, dropped), dropped))
    cases = []
    for index, (config, dropped) in enumerate(configs):
        dtype = rng.choices(["bfloat16", "float16", "float32"], [6, 3, 1])[0]
        if rng.random() < 0.8:
            config = {**config, "dtype": dtype, "torch_dtype": dtype}
        cases.append({
            "id": f"config-{index}", "config": config, "dropped": dropped, "platform": "vllm",
            "tp": pick(rng, (1, 2, 4, 8, 16)), "kernel": pick(rng, (16, 32, 64, 128)),
            "blockSize": pick(rng, (None, None, None, 16, 32, 64, 96, 128, 256, 512, 1024)),
            "kvCacheDtype": rng.choices(["auto", "bfloat16", "float16", "fp8", "fp8_e5m2", "int8"],
                                        [4, 1, 1, 1, 1, 1])[0],
            "specTokens": pick(rng, (0, 0, 0, 1, 2, 3)), "measure": True,
        })
    return cases


def rendered_dtype(config: dict) -> str:
    """The `--dtype` the operator renders: the reader's model dtype (for a config we refuse, vLLM's auto)."""
    try:
        return model_from_hf_config(config, "m").dtype
    except ConfigError:
        return "auto"


def probe_case(case: dict) -> dict:
    config = case["config"]
    glm = config["model_type"].startswith("glm5_next")
    keys = sorted(CONFIG_CLASSES[config["model_type"]].defaults)
    # A context below every class's max_position_embeddings default: a context length vLLM refuses is not
    # what this test is about.
    return {**case, "dtype": rendered_dtype(config), "keys": keys, "configOnly": glm, "maxModelLen": 1024}


def our_side(case: dict, model, role: str = "prefill") -> Side:
    return Side(role, model, case["tp"], kv_cache_dtype=case["kvCacheDtype"], block_size=case["blockSize"],
                kernel_block_size=case["kernel"], num_speculative_tokens=case["specTokens"], platform="vllm",
                prefix_caching=case.get("prefixCaching", False))


def sizes(case: dict, model) -> dict:
    layout = side_layout(our_side(case, model))
    state = [g for g in model.groups if g.kind == "state"]
    return {"block": layout.engine_block_size, "attnBytesPerToken": layout.attn_bytes_per_token,
            "stateBytes": layout.state_page_bytes,
            "attentionLayers": sum(g.num_layers for g in model.groups if g.kind in ("mla", "attention")),
            "stateLayers": sum(g.num_layers for g in state) if state else None}


def config_refusal(err: ConfigError, row: dict) -> tuple[str, str]:
    """Our reader refused the config: agreeing when vLLM refuses it too, or when the key it misses holds no
    value in vLLM's config either (its model code then reads it bare)."""
    if "refused" in row:
        return "both refuse", ""
    if err.missing and row["resolved"].get(err.missing) is None:
        return "pdctl refuses a later failure", str(err)
    return "extra_refusal", str(err)


def classify_glm(ours, row: dict) -> tuple[str, str]:
    """Config level: our description of the config against ours of vLLM's resolved values made explicit."""
    if "refused" in row:
        return "wrong_approval", row["refused"]
    explicit = {k: v for k, v in row["resolved"].items() if k != "linear_attn_config"}
    theirs = model_from_hf_config({**explicit, "architectures": ["Glm5NextForCausalLM"],
                                   "model_type": "glm5_next_text", "dtype": ours.dtype}, "m")
    if ours.groups != theirs.groups or ours.attention_heads != theirs.attention_heads:
        return "size_mismatch", f"pdctl {ours.groups}, vLLM's keys {theirs.groups}"
    return "both approve, same description", ""


def classify(case: dict, row: dict) -> tuple[str, str]:
    try:
        model = model_from_hf_config(case["config"], "m")
    except ConfigError as err:
        return config_refusal(err, row)
    if case["configOnly"]:
        return classify_glm(model, row)
    sides = [our_side(case, model, role) for role in ("prefill", "decode")]
    errors = [f for f in check_pair(*sides, prompt_tokens=64).findings if f.severity == "error"]
    states = {g.name for g in model.groups if g.kind == "state"}
    if "refused" in row:
        return ("both refuse", "") if errors else ("wrong_approval", row["refused"])
    if errors:
        codes = ",".join(sorted({f.code for f in errors}))
        later = all(f.code in LATER_CODES or (f.code == "HeadsNotDivisibleByTP" and f.group in states)
                    for f in errors)
        return ("pdctl refuses a later failure", codes) if later else ("extra_refusal", codes)
    ours = sizes(case, model)
    theirs = {key: row.get(key) for key in ours}
    if ours != theirs:
        return "size_mismatch", f"pdctl {ours}, vLLM {theirs}"
    return "both approve, same sizes", ""


DISAGREEING = (("wrong_approvals", "wrong_approval"), ("size_mismatches", "size_mismatch"),
               ("extra_refusals", "extra_refusal"), ("cost_mismatches", "cost_mismatch"))


def print_and_check(heading: str, cases: list[dict], outcomes: dict[str, tuple[str, str]]) -> Counter:
    """Print the count of each outcome and each kind of disagreement, fail on any; the counts."""
    counts = Counter(kind for kind, _ in outcomes.values())
    print(f"\n{heading}:")
    for kind, count in sorted(counts.items()):
        print(f"  {kind}: {count}")
    for total, kind in DISAGREEING:
        print(f"{total}: {counts[kind]}")
    bad = {cid: detail for cid, detail in outcomes.items() if detail[0] in dict(DISAGREEING).values()}
    assert not bad, "\n".join(f"{cid} (left out {next(c['dropped'] for c in cases if c['id'] == cid)}): "
                              f"{kind}: {why}" for cid, (kind, why) in list(bad.items())[:20])
    return counts


def test_pdctl_and_vllm_agree_on_generated_configs(classes):
    cases = [probe_case(c) for c in generated(classes)]
    unknown = {}
    for case in cases:  # the reader reads no key outside the introspected list
        try:
            read = set(resolved_keys(case["config"]))
        except ConfigError:
            continue
        text_type = "glm5_next" if case["configOnly"] else case["config"]["model_type"]
        unknown.update({key: case["id"] for key in read - known_keys(classes, text_type)})
    assert not unknown, f"the reader reads keys that are not the config class's: {unknown}"
    probed = run_probe(cases)
    outcomes = {c["id"]: classify(c, probed[c["id"]]) for c in cases}
    leaving_out = sum(1 for c in cases if c["dropped"])
    counts = print_and_check(f"differential over {len(cases)} generated configs (seed {SEED}), "
                             f"{leaving_out} leaving keys out", cases, outcomes)
    # The generator covers every architecture, and reaches every outcome the contract talks about.
    assert {c["config"]["architectures"][0] for c in cases} == set(SUPPORTED_ARCHITECTURES)
    assert leaving_out >= 500
    assert counts["both approve, same sizes"] >= 200 and counts["both refuse"] >= 50
    assert counts["both approve, same description"] >= 30


def costs(case: dict, row: dict) -> tuple[str, str]:
    """An approved side's prefix-caching costs against vLLM's (align mode for hybrid models)."""
    layout = side_layout(our_side(case, model_from_hf_config(case["config"], "m")))
    ours = {"mambaCacheMode": layout.mamba_cache_mode, "stateSlotsPerRequest": layout.state_slots_per_request,
            "hitTokens": layout.prefix_hit_tokens,
            # Without a state block size of ours one state block holds the whole request (max_model_len),
            # or the model has none.
            "mambaBlockSize": layout.state_block_size or (row["maxModelLen"] if layout.state_groups
                                                          else None)}
    theirs = {key: row.get(key) for key in ours}
    if ours != theirs:
        return "cost_mismatch", f"pdctl {ours}, vLLM {theirs}"
    return "both approve, same costs", ""


def test_pdctl_and_vllm_agree_with_prefix_caching_on(classes):
    """The same generator and contract with `--enable-prefix-caching` on both roles, plus what the blocks
    cost, with a second draw of hybrid models only. GLM-5.3-Flash stays at the config level here; its
    align-mode blocks and costs are checked against vllm-ascend's rule in test_vllm_blocksize.py."""
    # Every architecture, then as many again of the hybrid ones, where prefix caching changes the state cache.
    drawn = [(f"pc-{c['id']}", c) for c in generated(classes, PREFIX_CACHING_SEED)]
    drawn += [(f"pc-hybrid-{c['id']}", c) for c in generated(classes, PREFIX_CACHING_SEED + 1, HYBRID)]
    cases = [{**probe_case(c), "id": case_id, "prefixCaching": True} for case_id, c in drawn]
    probed = run_probe(cases)
    outcomes = {c["id"]: classify(c, probed[c["id"]]) for c in cases}
    for c in cases:
        if outcomes[c["id"]][0] == "both approve, same sizes":
            outcomes[c["id"]] = costs(c, probed[c["id"]])
    counts = print_and_check(f"differential with prefix caching on over {len(cases)} generated configs "
                             f"(seed {PREFIX_CACHING_SEED})", cases, outcomes)
    align = [c for c in cases if probed[c["id"]].get("mambaCacheMode") == "align"]
    assert {c["config"]["architectures"][0] for c in cases} == set(SUPPORTED_ARCHITECTURES)
    assert len(align) >= 300 and counts["both approve, same costs"] >= 300 and counts["both refuse"] >= 50

"""One test per default the config.json reader applies: the key is left out (or, for a derived default,
left out with the keys it derives from given), and the description carries the value the upstream class
gives it. Each row names that class and its version; the `vllm` tier checks the same values against the
classes themselves (tests/kv/test_vllm_differential.py)."""

from __future__ import annotations

import pytest

from pd_operator.kv.hf_config import CONFIG_CLASSES, model_from_hf_config
from pd_operator.kv.model import ModelKV

TF = "transformers 5.22.2"
VLLM = "vllm 0.34.0"
# Keys several rows leave out.
ATTENTION = "num_hidden_layers num_attention_heads hidden_size num_key_value_heads"
LINEAR = "linear_num_key_heads linear_num_value_heads linear_key_head_dim linear_value_head_dim"
DEEPSEEK = "num_hidden_layers num_attention_heads kv_lora_rank qk_rope_head_dim"
ASCEND = "vllm-ascend 0.30.0rc2"
GLM_LAYERS = ["linear_attention", "linear_attention", "linear_attention", "indexed_attention"] * 11 + [
    "linear_attention"]


def attention(m: ModelKV) -> tuple[int | None, int, int, int]:
    g = m.group("attention")
    return m.attention_heads, g.num_layers, g.num_kv_heads, g.head_size


def mla(m: ModelKV) -> tuple[int | None, int, int, int]:
    g = m.group("mla")
    return m.attention_heads, g.num_layers, g.kv_lora_rank, g.qk_rope_head_dim


def deltanet(m: ModelKV) -> tuple:
    g = m.group("deltanet")
    return g.num_layers, [(t.name, t.head_groups, t.head_shape, t.conv_kernel) for t in g.tensors]


def kda(m: ModelKV) -> tuple:
    g = m.group("kda")
    recurrent, conv = g.tensors
    return g.num_layers, recurrent.head_groups[0], recurrent.head_shape[0], conv.conv_kernel


def glm_indexer(m: ModelKV) -> tuple[int, int, int]:
    g = m.group("indexer")
    return g.head_dim, g.compress_ratio, g.mtp_layers


KIMI_KDA = {"kv_lora_rank": 256, "qk_rope_head_dim": 32, "linear_attn_config": {
    "kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 8, "head_dim": 64,
    "short_conv_kernel_size": 3}}
# (architecture, model_type, the keys left out whose defaults the row shows, config keys given, what the
# description shows, expected, the class, its version)
ROWS = [
    ("LlamaForCausalLM", "llama", f"{ATTENTION} head_dim", {}, attention, (32, 32, 32, 128), "LlamaConfig",
     TF),
    ("LlamaForCausalLM", "llama", "num_key_value_heads head_dim",
     {"num_attention_heads": 40, "hidden_size": 5120}, attention, (40, 32, 40, 128), "LlamaConfig", TF),
    ("MistralForCausalLM", "mistral", f"{ATTENTION} head_dim", {},
     attention, (32, 32, 8, 128), "MistralConfig", TF),
    ("MistralForCausalLM", "mistral", "head_dim", {"hidden_size": 5120}, attention, (32, 32, 8, 160),
     "MistralConfig", TF),
    ("MixtralForCausalLM", "mixtral", f"{ATTENTION} head_dim", {},
     attention, (32, 32, 8, 128), "MixtralConfig", TF),
    ("MixtralForCausalLM", "mixtral", "head_dim", {"num_attention_heads": 16}, attention, (16, 32, 8, 256),
     "MixtralConfig", TF),
    ("Qwen2ForCausalLM", "qwen2", ATTENTION, {}, attention, (32, 32, 32, 128), "Qwen2Config", TF),
    # Qwen2 has no head_dim field; vLLM's Qwen2Attention ignores a given one.
    ("Qwen2ForCausalLM", "qwen2", "hidden_size", {"head_dim": 64}, attention, (32, 32, 32, 128),
     "Qwen2Config", TF),
    ("Qwen2MoeForCausalLM", "qwen2_moe", ATTENTION, {}, attention, (16, 24, 16, 128), "Qwen2MoeConfig", TF),
    ("Qwen3ForCausalLM", "qwen3", "num_hidden_layers num_attention_heads head_dim", {"hidden_size": 2048},
     attention, (32, 32, 32, 128), "Qwen3Config", TF),
    ("Qwen3ForCausalLM", "qwen3", "num_key_value_heads", {"num_attention_heads": 64}, attention,
     (64, 32, 32, 128), "Qwen3Config", TF),
    ("Qwen3MoeForCausalLM", "qwen3_moe", f"{ATTENTION} head_dim", {}, attention, (32, 24, 4, 64),
     "Qwen3MoeConfig", TF),
    ("Qwen3MoeForCausalLM", "qwen3_moe", "num_attention_heads", {"head_dim": 128}, attention,
     (32, 24, 4, 128), "Qwen3MoeConfig", TF),
    ("DeepseekV2ForCausalLM", "deepseek_v2", DEEPSEEK, {}, mla, (32, 32, 512, 64), "DeepseekV2Config", TF),
    ("DeepseekV2ForCausalLM", "deepseek_v2", "kv_lora_rank", {"qk_rope_head_dim": 32}, mla,
     (32, 32, 512, 32), "DeepseekV2Config", TF),
    ("DeepseekV3ForCausalLM", "deepseek_v3", DEEPSEEK, {}, mla, (128, 61, 512, 64), "DeepseekV3Config", TF),
    ("DeepseekV32ForCausalLM", "deepseek_v32", DEEPSEEK, {"index_head_dim": 64}, mla, (128, 61, 512, 64),
     "DeepseekV3Config", TF),
    ("Qwen3NextForCausalLM", "qwen3_next", "num_hidden_layers num_attention_heads num_key_value_heads "
     "head_dim "
     "full_attention_interval layer_types", {"hidden_size": 4096}, attention, (16, 12, 2, 256),
     "Qwen3NextConfig", TF),
    ("Qwen3NextForCausalLM", "qwen3_next", "full_attention_interval", {"num_hidden_layers": 24},
     attention, (16, 6, 2, 256), "Qwen3NextConfig", TF),
    ("Qwen3NextForCausalLM", "qwen3_next", f"{LINEAR} linear_conv_kernel_dim", {}, deltanet,
     (36, [("conv", [16, 16, 32], [128], 4), ("recurrent", [32], [128, 128], None)]), "Qwen3NextConfig", TF),
    ("Qwen3NextForCausalLM", "qwen3_next", "linear_key_head_dim", {"linear_value_head_dim": 64}, deltanet,
     (36, [("conv-qk", [16, 16], [128], 4), ("conv-v", [32], [64], 4),
           ("recurrent", [32], [64, 128], None)]),
     "Qwen3NextConfig", TF),
    ("KimiLinearForCausalLM", "kimi_linear", "num_hidden_layers num_attention_heads", KIMI_KDA, mla,
     (32, 29, 256, 32), "KimiLinearConfig", VLLM),
    # GLM-5.3-Flash: vllm-ascend's own class (registered for both model_types by patch_glm5next_config.py).
    ("Glm5NextForCausalLM", "glm5_next_text", "num_hidden_layers layer_types num_attention_heads "
     "kv_lora_rank "
     "qk_rope_head_dim index_topk", {}, mla, (64, 45, 512, 0), "Glm5NextTextConfig", ASCEND),
    ("Glm5NextForCausalLM", "glm5_next_text", "index_kpool num_nextn_predict_layers",
     {"index_topk": 2048, "index_head_dim": 128}, glm_indexer, (128, 4, 1), "Glm5NextTextConfig", ASCEND),
    ("Glm5NextForCausalLM", "glm5_next_text", "linear_attn_config linear_num_heads linear_head_dim "
     "linear_conv_kernel_dim", {"layer_types": GLM_LAYERS}, kda, (34, 64, 128, 4), "Glm5NextTextConfig",
     ASCEND),
    # linear_attn_config's keys win; the ones it leaves out fall back to the flat keys, then the defaults.
    ("Glm5NextForCausalLM", "glm5_next_text", "linear_conv_kernel_dim",
     {"linear_attn_config": {"num_heads": 32}, "linear_head_dim": 64, "layer_types": GLM_LAYERS}, kda,
     (34, 32, 64, 4), "Glm5NextTextConfig", ASCEND),
    # Nested under text_config: the text class's defaults, not the top level's keys.
    ("Glm5NextForConditionalGeneration", "glm5_next", "num_hidden_layers",
     {"text_config": {}, "num_hidden_layers": 8}, mla, (64, 45, 512, 0), "Glm5NextTextConfig", ASCEND),
]


@pytest.mark.parametrize(("arch", "model_type", "key", "given", "show", "expected", "cls", "version"), ROWS,
                         ids=[f"{r[6]}-{r[2].replace(' ', '-')}" for r in ROWS])
def test_left_out_key_takes_the_upstream_default(arch, model_type, key, given, show, expected, cls, version):
    assert not set(key.split()) & set(given.get("text_config", given))
    model = model_from_hf_config({"architectures": [arch], "model_type": model_type, **given}, "m")
    assert show(model) == expected
    table = CONFIG_CLASSES[model_type]
    assert (table.name, table.source.split(":")[0]) == (cls, version)


def test_every_default_in_the_table_has_a_row():
    """No default is applied without a row above (REQUIRED keys are refused, see test_hf_config.py)."""
    covered = {(r[1], k) for r in ROWS for k in r[2].split()}
    applied = {(mt, key) for mt, table in CONFIG_CLASSES.items() for key, value in table.defaults.items()
               if value is not None}
    glm = {mt for mt in CONFIG_CLASSES if mt.startswith("glm5_next")}
    missing = {(mt, key) for mt, key in applied - covered
               if not (mt in glm and any((other, key) in covered for other in glm))}
    assert not missing, sorted(missing)

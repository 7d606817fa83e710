"""Descriptions of a model's KV caches: one cache group per kind of layer.

A description holds only what sets bytes and layout: shapes, dtypes and layer counts. The same
types appear in the PDDeployment API (an explicit description inline in the manifest), so their
field docs are what `kubectl explain` shows.
"""

from __future__ import annotations

from math import prod
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pd_operator.api_model import ApiModel
from pd_operator.kv.dtypes import DTYPES, dtype_bytes


def _known_dtype(name: str) -> str:
    dtype_bytes(name)  # raises ValueError naming the accepted dtypes
    return name


DType = Annotated[str, AfterValidator(_known_dtype), Field(json_schema_extra={"enum": list(DTYPES)})]
PositiveInt = Annotated[int, Field(ge=1, le=1_000_000)]


class _Group(ApiModel):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
    """Cache group name, used in findings and transfer plans (for example `mla`, `indexer`, `kda`)."""
    num_layers: PositiveInt
    """How many layers carry this cache group; sets the bytes moved per request."""
    mtp_layers: int = Field(default=0, ge=0, le=16)
    """Further layers of this group that exist only with MTP speculative decoding
    (numSpeculativeTokens > 0): the draft model's next-token-prediction layers."""

    def layers(self, num_speculative_tokens: int) -> int:
        """Layers holding this cache on a side that runs `num_speculative_tokens` draft tokens."""
        return self.num_layers + (self.mtp_layers if num_speculative_tokens else 0)


class AttentionGroup(_Group):
    """Dense (MHA/GQA) attention: K and V, kv heads sharded over tensor parallel ranks."""

    kind: Literal["attention"] = "attention"
    num_kv_heads: PositiveInt
    """Key/value heads. Sharded over TP; when fewer than TP, each rank holds one replicated head."""
    head_size: PositiveInt
    dtype: DType | None = None
    """Cache dtype of this group; defaults to the deployment's KV cache dtype."""


class MLAGroup(_Group):
    """Multi-head latent attention: one latent head replicated on every TP rank, no V."""

    kind: Literal["mla"] = "mla"
    kv_lora_rank: PositiveInt
    qk_rope_head_dim: int = Field(default=0, ge=0, le=1_000_000)
    """Rope component of the latent; 0 is legal (NoPE MLA layers)."""
    dtype: DType | None = None


class IndexerGroup(_Group):
    """Sparse-attention indexer keys (DeepSeek-V3.2 style): one replicated head, optionally compressed."""

    kind: Literal["indexer"] = "indexer"
    head_dim: PositiveInt
    compress_ratio: PositiveInt = 1
    """Tokens per stored entry; a compressed indexer stores block/compressRatio entries per block."""
    quant_block_size: PositiveInt = 128
    """fp8 caches store one 4-byte scale per quantBlockSize elements."""
    dtype: DType | None = None


class IndexerTailGroup(_Group):
    """The open pool of a compressed indexer (GLM-Next): the fp32 keys and gate scores of the tokens not yet
    pooled, one `[2, poolTokens + numSpeculativeTokens, headDim]` page per request and layer, replicated on
    every TP rank (vllm-ascend: `Glm5NextTailCache`, `AscendIndexerKPoolTailSpec`)."""

    kind: Literal["indexerTail"] = "indexerTail"
    head_dim: PositiveInt
    pool_tokens: PositiveInt
    """Tokens pooled into one indexer entry (the indexer's compressRatio, `index_kpool`)."""
    dtype: DType = "float32"

    def bytes_per_request(self, num_speculative_tokens: int) -> int:
        return 2 * (self.pool_tokens + num_speculative_tokens) * self.head_dim * dtype_bytes(self.dtype)


class StateTensor(ApiModel):
    """One per-request state tensor of a linear-attention/Mamba layer, laid out part-major, then head."""

    name: str = Field(min_length=1, max_length=63)
    dtype: DType
    head_groups: list[PositiveInt] = Field(min_length=1, max_length=16)
    """Heads of each concatenated part (for example [64, 64, 64] for the q/k/v conv state); each is
    sharded over TP."""
    head_shape: list[PositiveInt] = Field(min_length=1, max_length=4)
    """Shape of the state of one head, for example [128, 128] for a recurrent state."""
    conv_kernel: PositiveInt | None = None
    """When set, a trailing dimension of convKernel-1+numSpeculativeTokens columns is appended (conv
    state)."""

    def columns(self, num_speculative_tokens: int) -> int:
        if self.conv_kernel is None:
            return 1
        return self.conv_kernel - 1 + num_speculative_tokens

    def elements_per_head(self, num_speculative_tokens: int) -> int:
        return prod(self.head_shape) * self.columns(num_speculative_tokens)


class StateGroup(_Group):
    """Linear-attention / Mamba state: per request, not per token; shrinks as TP grows."""

    kind: Literal["state"] = "state"
    tensors: list[StateTensor] = Field(min_length=1, max_length=8)


CacheGroup = Annotated[
    AttentionGroup | MLAGroup | IndexerGroup | IndexerTailGroup | StateGroup, Field(discriminator="kind")
]


class ModelKV(ApiModel):
    """The KV-relevant shape of a model."""

    name: str = Field(min_length=1, max_length=253)
    """Model identity (preset name or Hugging Face id); prefill and decode must agree on it."""
    dtype: DType = "bfloat16"
    """Model (activation) dtype; the KV cache dtype `auto` resolves to it."""
    attention_heads: PositiveInt | None = None
    """Query heads (`num_attention_heads`); vLLM refuses a tensor parallel size that does not divide them."""
    groups: list[CacheGroup] = Field(min_length=1, max_length=16)

    @field_validator("groups")
    @classmethod
    def _unique_names(cls, groups: list) -> list:
        names = [g.name for g in groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"cache group names must be unique; repeated: {', '.join(dupes)}")
        return groups

    @model_validator(mode="after")
    def _one_state_kind(self) -> ModelKV:
        attention_like = [g for g in self.groups if g.kind in ("mla", "attention")]
        if not attention_like and any(g.kind in ("state", "indexer", "indexerTail") for g in self.groups):
            raise ValueError("a model with state or indexer groups needs an attention or mla group")
        return self

    def group(self, name: str):
        return next(g for g in self.groups if g.name == name)

    @property
    def is_hybrid(self) -> bool:
        return any(g.kind == "state" for g in self.groups)

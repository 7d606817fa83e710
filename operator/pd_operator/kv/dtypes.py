"""Byte widths of the dtypes a KV cache or a state tensor may use."""

from __future__ import annotations

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}

# Spellings people use for the same storage type; the first listed is the canonical one.
_CANONICAL = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}

DTYPES = tuple(sorted(DTYPE_BYTES))


def dtype_bytes(name: str) -> int:
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


def canonical_dtype(name: str) -> str:
    low = name.lower()
    return _CANONICAL.get(low, low)


def is_fp8(name: str) -> bool:
    return canonical_dtype(name) == "fp8"


def resolve_cache_dtype(kv_cache_dtype: str, model_dtype: str) -> str:
    """vLLM's `--kv-cache-dtype auto` means 'same as the model dtype'."""
    return canonical_dtype(model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype)

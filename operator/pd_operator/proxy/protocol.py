"""The PD request protocol between the proxy and vLLM's OpenAI endpoints. Pure.

The same exchange as vllm-ascend's example proxy (vllm-project/vllm-ascend:
examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py @ v0.30.0rc2,
`build_prefill_request`, `assign_instances`, `update_cached_tokens_in_chunk`), written here:

1. prefill gets the client's body with `kv_transfer_params` asking for a remote decode, one output
   token (`max_tokens`, `min_tokens`, and `max_completion_tokens` when the client set it), no
   streaming and no `stream_options`;
2. decode gets the client's body unchanged except for `kv_transfer_params`, which become the ones
   prefill answered (where its blocks are: engine id, block ids, host, port, request id), always:
   the client's own never reach an engine, and a prefill answer without them is an error;
3. the client gets decode's answer; where it reports usage (the whole answer when not streaming,
   the usage-only event of a stream) `prompt_tokens_details.cached_tokens` is prefill's, since
   prefill is where the prompt was computed.
"""

from __future__ import annotations

import json
from typing import Any

# What the prefill engine is asked for: "compute the prompt, keep the blocks for a remote decode".
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None}


def prefill_request(body: dict) -> dict:
    out = {**body, "kv_transfer_params": dict(PREFILL_KV_PARAMS), "stream": False, "max_tokens": 1,
           "min_tokens": 1}
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    return out


def kv_params(prefill_answer: object) -> dict:
    """Where prefill's blocks are; ValueError when the answer does not say. Unlike the example
    proxy, which then passes the client's body on as it is, an answer without them is prefill's
    failure: the client's own kv_transfer_params would reach decode, and they can name any host
    to pull from and another request's blocks."""
    if not isinstance(prefill_answer, dict):
        raise ValueError("the answer is not a JSON object")
    params = prefill_answer.get("kv_transfer_params")
    if not isinstance(params, dict) or not params:
        raise ValueError("the answer carries no kv_transfer_params")
    return params


def decode_request(body: dict, prefill_answer: dict) -> dict:
    """Decode's request: the client's body with prefill's kv_transfer_params in place of any the
    client sent. ValueError when prefill gave none (kv_params)."""
    return {**body, "kv_transfer_params": kv_params(prefill_answer)}


def cached_tokens(prefill_answer: dict) -> int:
    """Prompt tokens prefill found in its prefix cache (0 when it does not say)."""
    details = (prefill_answer.get("usage") or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return value if isinstance(value, int) else 0


def _with_cached(answer: Any, cached: int) -> bool:
    """Set usage.prompt_tokens_details.cached_tokens in place; False when there is no usage."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return False
    details = usage.get("prompt_tokens_details")
    usage["prompt_tokens_details"] = {**(details if isinstance(details, dict) else {}),
                                      "cached_tokens": cached}
    return True


def patch_answer(data: bytes, cached: int) -> bytes:
    """A whole (non-streamed) decode answer with prefill's cached tokens; unchanged if not JSON."""
    try:
        answer = json.loads(data)
    except ValueError:
        return data
    return json.dumps(answer, ensure_ascii=False).encode() if _with_cached(answer, cached) else data


DATA = b"data: "


def patch_event(event: bytes, cached: int) -> bytes:
    """One server-sent event of a decode stream (without its blank-line terminator): the usage-only
    event (no choices) gets prefill's cached tokens; every other event passes unchanged."""
    if b'"usage"' not in event or not event.startswith(DATA):
        return event
    try:
        chunk = json.loads(event[len(DATA):])
    except ValueError:
        return event
    if not isinstance(chunk, dict) or chunk.get("choices") or not _with_cached(chunk, cached):
        return event
    return DATA + json.dumps(chunk, ensure_ascii=False).encode()


class EventFramer:
    """Splits a byte stream into server-sent events (separated by a blank line) so each can be
    patched whole; bytes of an unfinished event wait for the rest."""

    SEPARATOR = b"\n\n"

    def __init__(self, cached: int) -> None:
        self.cached = cached
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        """The complete events in pending + data, patched, each with its separator."""
        self._pending += data
        *events, self._pending = self._pending.split(self.SEPARATOR)
        return b"".join(patch_event(e, self.cached) + self.SEPARATOR for e in events)

    def flush(self) -> bytes:
        """What is left at the end of the stream (an event without its separator)."""
        rest, self._pending = self._pending, b""
        return patch_event(rest, self.cached) if rest else b""

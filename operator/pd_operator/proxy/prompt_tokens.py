"""What a request asks prefill to compute, as prefix routing keys it, and its cache salt. Pure.

Token ids: the proxy hashes what the engine prefills. A completion whose `prompt` is token ids (one
list of numbers, or a batch of exactly one) is prefilled as those ids, as they are (vLLM adds no
special tokens to a token prompt: vllm-project/vllm: vllm/entrypoints/openai/completion/serving.py @
v0.34.0 passes them to the engine as `prompt_token_ids`). A list is taken as ids by its first element
(a number; a string makes it a batch of texts, a list a batch of prompts), and the ids are not
checked one by one: that would be a pass over every id on each request's path, and vLLM checks them
anyway (how the index keys them, and why an id vLLM rejects does no harm: proxy/prefix_index.py).

Text: a text prompt or a chat request becomes token ids only through the model's tokenizer and chat
template, which pd-proxy does not load. Approximate routing keys them by their text instead, as the
Gateway API Inference Extension's approximate prefix scorer does (kubernetes-sigs/
gateway-api-inference-extension: pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go @
00913f9, `hashPrompt`: the prompt's characters in blocks of vLLM's 16-token block at 4 characters a
token): a text prompt as it is; a chat request as its `tools` and then each message's role and
content in order, the parts a chat template renders from the start of the prompt, so a conversation's
next turn extends the text of the one before. Text blocks are CHARS_PER_TOKEN characters per token of
the engine block, so where text and tokens disagree the estimate is off by a block, never the
routing's correctness: the engine computes whatever it does not hold. Precise routing keys what the
engines report, by token ids: text keys never match it, so there text and chat go by load alone.

A batch of several prompts is several engine requests with different prefixes: no single prefix to
route by, so load alone too.

`cache_salt` (vLLM's request field; vllm: vllm/entrypoints/openai/engine/protocol.py @ v0.34.0) keys
the first block's hash in vLLM, so requests with different salts never share cached blocks; the
index keys them apart the same way (proxy/prefix_index.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
CHARS_PER_TOKEN = 4
"""Characters of text taken for one token (the estimate of the scorer cited above)."""


@dataclass(frozen=True)
class PromptTokens:
    tokens: Sequence[int] | str
    """The token ids, or (a text prompt, a chat request) the text keyed in their place. The ids are
    the parsed body's own list, not a copy: a copy held 800 KB more per 100,000-token request in
    flight, and dropping it did not move the decision's time (docs/benchmarks.md, bench/routing.py
    `routing_overhead_p99_ms`); the proxy never edits a prompt."""
    salt: str = ""

    @property
    def is_text(self) -> bool:
        return isinstance(self.tokens, str)

    @property
    def per_token(self) -> int:
        """Elements of `tokens` per prompt token: 1 for ids, CHARS_PER_TOKEN for text."""
        return CHARS_PER_TOKEN if self.is_text else 1

    def __len__(self) -> int:
        """Prompt tokens (estimated for text)."""
        return ceil(len(self.tokens) / self.per_token)


def prompt_tokens(path: str, body: dict) -> PromptTokens | None:
    """What `body` asks `path` to prefill, keyed as above, with its salt; None when it names no single
    prompt."""
    salt = body.get("cache_salt")
    salt = salt if isinstance(salt, str) else ""
    if path == CHAT:
        text = _chat_text(body)
        return PromptTokens(text, salt) if text else None
    if path != COMPLETIONS:
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return PromptTokens(prompt, salt) if prompt else None
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[0], int | float):
        return None
    return PromptTokens(prompt, salt)


def _chat_text(body: dict) -> str:
    """The chat request's tools and messages as one text, each field led by a separator no JSON text
    holds unescaped; "" when it has no messages list."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return ""
    parts = [] if body.get("tools") is None else ["\0tools\0", _text(body["tools"])]
    for message in messages:
        if isinstance(message, dict):
            parts += ["\0", _text(message.get("role")), "\0", _text(message.get("content"))]
            rest = {k: v for k, v in message.items() if k not in ("role", "content")}
            if rest:  # a tool call's id and arguments, a name: rendered by the template too
                parts += ["\0", _text(rest)]
        else:
            parts += ["\0?\0", _text(message)]
    return "".join(parts)


def _text(value: object) -> str:
    """A string as it is; content parts' text joined; anything else (images, tool calls) as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)

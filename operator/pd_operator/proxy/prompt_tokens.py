"""The prompt token ids a request carries, and its cache salt, for prefix routing. Pure.

The proxy hashes what the engine prefills: a completion whose `prompt` is token ids (one list of
numbers, or a batch of exactly one) is prefilled as those ids, as they are (vLLM adds no special
tokens to a token prompt: vllm-project/vllm: vllm/entrypoints/openai/completion/serving.py @ v0.34.0
passes them to the engine as `prompt_token_ids`). A list is taken as ids by its first element (a
number; a string makes it a batch of texts, a list a batch of prompts), and the ids are not checked
one by one: that would be a pass over every id on each request's path, and vLLM checks them anyway
(how the index keys them, and why an id vLLM rejects does no harm: proxy/prefix_index.py).

A text prompt or a chat request becomes token ids only through the model's tokenizer and chat
template, which pd-proxy does not load: such requests carry no token ids here and are routed by load
alone (docs/architecture.md, "Routing by cached prefix"). A batch of several prompts is several
engine requests with different prefixes: no single prefix to route by, so load alone too.

`cache_salt` (vLLM's request field; vllm: vllm/entrypoints/openai/engine/protocol.py @ v0.34.0) keys
the first block's hash in vLLM, so requests with different salts never share cached blocks; the
index keys them apart the same way (proxy/prefix_index.py).
"""

from __future__ import annotations

from dataclasses import dataclass

COMPLETIONS = "/v1/completions"


@dataclass(frozen=True)
class PromptTokens:
    tokens: tuple[int, ...]
    salt: str = ""


def prompt_tokens(path: str, body: dict) -> PromptTokens | None:
    """The token ids `body` asks `path` to prefill, with its salt; None when it names no single token
    prompt."""
    if path != COMPLETIONS:
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[0], int | float):
        return None
    salt = body.get("cache_salt")
    return PromptTokens(tuple(prompt), salt if isinstance(salt, str) else "")

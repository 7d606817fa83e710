"""Block boundaries of prefix routing for every example's resolved layout, prefix caching off and on:
the membership gives each prefill the block its engine is rendered with (`--block-size`), and only when
that engine caches prefixes (`--enable-prefix-caching`); the proxy cuts prompts there. Pure."""

from __future__ import annotations

import copy

import pytest

from pd_operator.proxy.prefix_index import block_keys
from pd_operator.proxy.prefix_routing import Prompt
from pd_operator.proxy.prompt_tokens import PromptTokens
from pd_operator.render import render
from support.renders import VALID_EXAMPLES, proxy_membership, serving_argv, serving_sets
from support.specs import example, resolve


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("caching", [False, True], ids=["caching-off", "caching-on"])
@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_prefill_blocks_are_the_engines_own(path, caching):
    doc = copy.deepcopy(example(path))
    doc["spec"]["prefill"]["enablePrefixCaching"] = caching
    ctx = resolve(doc)
    manifests = render(ctx)
    first = ctx.names.instance("prefill", 0)
    (engine,) = [s for s in serving_sets(manifests) if s["metadata"]["name"] == first]
    argv = serving_argv(engine)
    block = int(flag(argv, "--block-size") or 0)
    assert block == ctx.engine_block_size("prefill")
    assert ("--enable-prefix-caching" in argv) is caching
    members = proxy_membership(manifests).prefill
    assert members
    for member in members:
        assert member.block_tokens == (block if caching else None)
    if caching:
        # A prompt of 2.5 blocks has 2 keys, cut at the engine's boundaries.
        tokens = tuple(range(block * 5 // 2))
        keys = Prompt(PromptTokens(tokens)).keys(block)
        assert keys == block_keys(tokens, block) and len(keys) == 2
        assert keys[0] == block_keys(tokens[:block], block)[0]

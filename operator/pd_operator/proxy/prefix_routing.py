"""Prefix routing: which prefill is expected to hold a request's prefix, and at what cost each
prefill would answer it. No I/O; one event loop owns it.

Modes (pd-proxy `--prefix-routing`, rendered from spec.proxy.routing.prefix):
- `off`: main's balancer alone, the prefill with the fewest requests in flight (balancer.py);
- `approximate` (the default): the proxy records, per prefill member, the blocks of every request
  it routed there, within that member's KV capacity (`cacheBlocks` of its membership entry,
  spec.proxy.routing.prefillCacheBlocks; DEFAULT_CACHE_BLOCKS without it), forgetting the least
  recently routed first, as vLLM's cache evicts. No coupling to the engines; it is wrong where an
  engine evicted sooner than the bound says, or where another proxy replica routed the prefix;
- `precise`: the index holds what the engines report: each prefill member's vLLM KV-events
  publishers (membership `events`, one per DP rank) feed it (proxy/kv_events.py `Feed`; the server
  subscribes to `PrefixRouter.feeds`), each rank a holder of its own within `cacheBlocks`; a member
  is expected to hold what its best rank holds.

What a member is expected to hold is counted in whole blocks of its layout's `blockTokens`
(membership.py): a member without one is scored as holding nothing. A request without token ids is
keyed by its text in approximate mode and routed by load alone in precise mode, and one naming no
single prompt by load alone in both (proxy/prompt_tokens.py), as in `off`.

Choice (Balancer.pick, with `PrefixRouter.hit_tokens`): a prefill's cost is the prompt tokens it
would compute (the prompt less the prefix it is expected to hold) plus what it is expected to have
left of the requests in flight there (their tokens less what it computed since its last answer, at
the rate it answered the recent ones: balancer.py); the cheapest wins, fewer requests in flight
breaking ties.
So a member holding the prefix wins until what it has left costs more than recomputing the prefix
elsewhere.
Decode is chosen by load alone: which decode holds a prefix does not matter, since decode receives
every prompt block from prefill (decode-side reuse is out of scope: docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import get_args

from pd_operator.api.types import PrefixRoutingMode as Mode
from pd_operator.api.types import ProxyRouting
from pd_operator.proxy.kv_events import Feed
from pd_operator.proxy.membership import Membership, Upstream
from pd_operator.proxy.prefix_index import Key, PrefixIndex, block_keys
from pd_operator.proxy.prompt_tokens import PromptTokens

MODES: tuple[Mode, ...] = get_args(Mode)
DEFAULT_MODE: Mode = ProxyRouting.model_fields["prefix"].default
DEFAULT_CACHE_BLOCKS = 65_536
"""Approximate mode's bound per prefill member when its membership entry gives no `cacheBlocks`
(spec.proxy.routing.prefillCacheBlocks unset)."""


@dataclass
class Prompt:
    """One request's prompt as prefix routing sees it; its keys computed once per block size."""

    tokens: PromptTokens
    _keys: dict[int, list[Key]] = field(default_factory=dict)
    picked: dict[str, int] = field(default_factory=dict)
    """Per member, the prompt tokens it was expected to hold when the last Balancer.pick scored it,
    until Balancer.serving of the call that pick chose takes them."""

    def keys(self, block_tokens: int) -> list[Key]:
        """The keys of its whole `block_tokens`-token blocks (of text: as many characters per token
        as prompt_tokens.py takes)."""
        if block_tokens not in self._keys:
            self._keys[block_tokens] = block_keys(self.tokens.tokens, block_tokens * self.tokens.per_token,
                                                  self.tokens.salt)
        return self._keys[block_tokens]

    def __len__(self) -> int:
        return len(self.tokens)


def holder(name: str, rank: int | None = None) -> str:
    """The index holder of a member (approximate mode) or of one DP rank's publisher (precise)."""
    return name if rank is None else f"{name}/dp{rank}"


FeedKey = tuple[str, str, int]
"""(publisher endpoint, index holder, block tokens)."""


class PrefixRouter:
    """The prefix index of one proxy and what it says about the prefill members."""

    def __init__(self, mode: Mode = DEFAULT_MODE) -> None:
        if mode not in MODES:
            raise ValueError(f"prefix routing mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode: Mode = mode
        self.index = PrefixIndex(DEFAULT_CACHE_BLOCKS)
        self._members: dict[str, Upstream] = {}
        self._holders: dict[str, tuple[str, ...]] = {}
        """Member name -> its holders in the index."""
        self.feeds: dict[FeedKey, Feed] = {}
        """precise: what each publisher of the members feeds (the server subscribes to each)."""

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def update(self, membership: Membership) -> None:
        """Follow a membership: a prefill member that left, or whose layout's block changed, loses
        what the index held for it."""
        members = {u.name: u for u in membership.prefill}
        changed = set()
        for name, old in self._members.items():
            new = members.get(name)
            if new is None or (new.block_tokens, new.layout, new.events) != (old.block_tokens, old.layout,
                                                                          old.events):
                changed.add(name)
                for h in self._holders.get(name, ()):
                    self.index.drop(h)
        self._members = members
        self._holders = {name: self._holders_of(u) for name, u in members.items()}
        for name, u in members.items():
            for h in self._holders[name]:
                self.index.set_capacity(h, u.cache_blocks)
        if self.mode == "precise":
            wanted = {(endpoint, holder(u.name, rank), u.block_tokens): u.name for u in members.values()
                      if u.block_tokens is not None for rank, endpoint in enumerate(u.events)}
            self.feeds = {key: (self.feeds[key] if key in self.feeds and name not in changed
                                else Feed(self.index, key[1], key[2]))
                          for key, name in wanted.items()}

    def forget(self, member: Upstream) -> None:
        """`member`'s prefix cache was reset: the index holds nothing for it."""
        for h in self._holders.get(member.name, ()):
            self.index.clear(h)

    def _holders_of(self, member: Upstream) -> tuple[str, ...]:
        if self.mode == "precise":
            return tuple(holder(member.name, rank) for rank in range(len(member.events)))
        return (holder(member.name),)

    def prompt(self, tokens: PromptTokens | None) -> Prompt | None:
        """The request's prompt for scoring (None: not routed by prefix; text in precise mode, whose
        index holds the engines' token ids only)."""
        if not self.on or tokens is None or (tokens.is_text and self.mode == "precise"):
            return None
        return Prompt(tokens)

    def hit_tokens(self, prompt: Prompt, members: Iterable[Upstream]) -> dict[str, int]:
        """Per member, the prompt tokens it is expected to hold from the start."""
        out: dict[str, int] = {}
        by_block: dict[int, list[Upstream]] = {}
        for u in members:
            out[u.name] = 0
            if u.block_tokens is not None:
                by_block.setdefault(u.block_tokens, []).append(u)
        for block, group in by_block.items():
            keys = prompt.keys(block)
            if not keys:
                continue
            holders = {h: u.name for u in group for h in self._holders.get(u.name, ())}
            for h, blocks in self.index.hits(keys, holders).items():
                out[holders[h]] = max(out[holders[h]], blocks * block)
        return out

    def routed(self, member: Upstream, prompt: Prompt) -> None:
        """`prompt` goes to prefill `member`: in approximate mode its blocks are held there from now."""
        if self.mode == "approximate" and member.block_tokens is not None and member.name in self._holders:
            self.index.touch(holder(member.name), prompt.keys(member.block_tokens))

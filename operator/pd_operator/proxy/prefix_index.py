"""Which prefill holds which prompt prefix, block by block: pd-proxy's prefix index. Pure (no I/O,
no clock).

Keys. A prompt's token ids are cut into whole blocks of `block_tokens`, the resolved engine block
that member's engines run (spec/validate.py `Resolved.prefix_hit_tokens`, or an older revision's own
during a rollout; carried to the proxy by the membership: proxy/membership.py); a partial last block
is never cached by vLLM, so it has no key. Each block's key chains its parent's key with its own
tokens (as vLLM's block hashes do: vllm-project/vllm: vllm/v1/core/kv_cache_utils.py @ v0.34.0,
`hash_block_tokens`), so a key stands for the whole prefix up to it. The chain starts from a root
made of `block_tokens` and the request's `cache_salt`: requests with different salts, or hashed for
layouts of different block sizes, never share a key. Keys are the proxy's own, not vLLM's: vLLM
seeds its hashes per process, and the precise mode (proxy/kv_events.py) turns each engine hash into
the proxy's key from the token ids the event carries.

A key is Python's 64-bit hash of (parent key, the block's ids as a tuple): hashing the ids where
the parsed body holds them costs a few nanoseconds a token, where packing them into bytes first for
a digest cost several times that (bench/routing.py `routing_overhead_p99_ms`). It is deterministic
(ints and tuples of ints hash alike in every process; the root is a BLAKE2b digest). It is not
collision-resistant against a crafted prompt: a collision can only send a request to a prefill
expected to hold a prefix it does not hold (the engine keys its own cache by its own hashes), which
costs that request a recomputed prefix, as a miss does; an accidental one among the index's keys has
odds near 2^-64 per lookup and held key. Numbers hash by value (1, 1.0 and true alike), as vLLM's
request model reads them alike as token ids (pydantic's lax int: vllm/entrypoints/openai/completion/
protocol.py @ v0.34.0); an id it reads otherwise ("2") only misses. The ids are not checked here:
vLLM answers a prompt with an id it rejects (negative, past the vocabulary) with a 400, wherever it
went; an element that has no hash (a list, an object) ends the prompt's keys before its block.

Holders. A holder is a string: an instance name in approximate mode, an instance's DP rank's
publisher in precise mode (`<instance>/dp<rank>`: each DP rank caches on its own). Per key, its
holders as a bit mask (each known holder has a bit; a dropped holder's bit is reused): an int per key
rather than a set keeps the index out of the garbage collector's way (a set per key made each full
collection walk every held key, milliseconds on a request's path) and makes a lookup one AND per
block. Per holder, its keys in least-recently-used order and a capacity in blocks. `hits`
walks a request's keys from the first and stops at the first key none of the candidates holds, so
its cost grows with the request's matched blocks and the candidates, never with what the index
holds; holding, touching and forgetting a key are O(1) each. Memory is bounded: each holder holds at
most its capacity, the oldest key going first (and so a departed or cleared holder frees its keys).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

Key = int
MAX_CAPACITY = 10_000_000
"""A holder never holds more keys than this, whatever its capacity says (about 2 GB of index, at
some 190 bytes a key)."""


def block_keys(tokens: Sequence[object] | str, block_tokens: int, salt: str = "") -> list[Key]:
    """The chained keys of the whole `block_tokens` blocks of `tokens` under `salt` (up to a block
    holding an element without a hash). A str is text (proxy/prompt_tokens.py), cut into blocks of
    `block_tokens` characters under a root of its own: text and token ids never share a key. Text
    keys hash strings, which Python seeds per process: they stay within the proxy that made them
    (approximate routing), unlike token keys."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, not {block_tokens}")
    parent = root_key(block_tokens, salt, text=isinstance(tokens, str))
    out = []
    try:
        for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
            block = tokens[start:start + block_tokens]
            # A block of a list is copied into a tuple, the hashable form of the same ids; a copy
            # per block costs less than one of the whole prompt first (the ids stay in the body).
            parent = hash((parent, block if isinstance(block, str | tuple) else tuple(block)))
            out.append(parent)
    except TypeError:  # an unhashable element: vLLM rejects the prompt
        pass
    return out


def root_key(block_tokens: int, salt: str, text: bool = False) -> Key:
    """Where every chain of `block_tokens` blocks (of characters when `text`) under `salt` starts."""
    kind = "pd-prefix-text" if text else "pd-prefix"
    digest = hashlib.blake2b(f"{kind}\0{block_tokens}\0{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def tokens_key(parent: Key, tokens: Sequence[int]) -> Key:
    """The key of a block of token ids after the block keyed `parent`."""
    return hash((parent, tuple(tokens)))


class PrefixIndex:
    """Per key, its holders; per holder, its keys (oldest first) within its capacity."""

    def __init__(self, default_capacity: int) -> None:
        self.default_capacity = _bounded(default_capacity)
        self._holders: dict[Key, int] = {}
        """Per key, the bits of its holders."""
        self._held: dict[str, OrderedDict[Key, None]] = {}
        self._capacity: dict[str, int] = {}
        self._bits: dict[str, int] = {}
        """Per holder, its bit."""
        self._free_bits: list[int] = []
        """Bits of dropped holders, for the next new ones."""

    # --- what is held --------------------------------------------------------------------------------

    def hits(self, keys: Sequence[Key], candidates: Iterable[str]) -> dict[str, int]:
        """Per candidate, how many of `keys` it holds from the first on (0: none)."""
        out = dict.fromkeys(candidates, 0)
        bits = {holder: bit for holder in out if (bit := self._bits.get(holder))}
        alive = sum(bits.values())
        holders = self._holders
        depth = 0
        for key in keys:
            still = alive & holders.get(key, 0)
            if still != alive:
                for holder, bit in bits.items():
                    if alive & bit and not still & bit:
                        out[holder] = depth
                alive = still
                if not alive:
                    return out
            depth += 1
        for holder, bit in bits.items():
            if alive & bit:
                out[holder] = depth
        return out

    def holds(self, holder: str, key: Key) -> bool:
        return key in self._held.get(holder, ())

    def size(self, holder: str | None = None) -> int:
        """Keys `holder` holds (None: entries over every holder)."""
        if holder is not None:
            return len(self._held.get(holder, ()))
        return sum(len(keys) for keys in self._held.values())

    def holders(self) -> list[str]:
        return sorted(self._held)

    def capacity(self, holder: str) -> int:
        return self._capacity.get(holder, self.default_capacity)

    # --- changes -------------------------------------------------------------------------------------

    def set_capacity(self, holder: str, blocks: int | None) -> None:
        """`holder` holds at most `blocks` keys (None: the default); the oldest go first."""
        if blocks is None:
            self._capacity.pop(holder, None)
        else:
            self._capacity[holder] = _bounded(blocks)
        self._evict(holder)

    def store(self, holder: str, keys: Iterable[Key]) -> None:
        """`holder` holds `keys` (each, in the order given, becomes its most recent); past its
        capacity its least recently stored keys go."""
        held = self._held.setdefault(holder, OrderedDict())
        bit = self._bit(holder)
        holders = self._holders
        for key in keys:
            if key in held:
                held.move_to_end(key)
            else:
                held[key] = None
                holders[key] = holders.get(key, 0) | bit
        self._evict(holder)

    def touch(self, holder: str, keys: Sequence[Key]) -> None:
        """A request used `keys` on `holder`: record them as vLLM's cache keeps them, the prefix
        longest (a freed request's blocks are evicted last block first: vllm-project/vllm:
        vllm/v1/core/block_pool.py @ v0.34.0, `free_blocks`), so an eviction never leaves a key
        whose parent went."""
        self.store(holder, reversed(keys))

    def remove(self, holder: str, keys: Iterable[Key]) -> None:
        held = self._held.get(holder)
        if held is None:
            return
        for key in keys:
            if key in held:
                del held[key]
                self._unhold(key, holder)
        if not held:
            del self._held[holder]

    def clear(self, holder: str) -> None:
        """`holder` holds nothing (a cleared cache, a resync); its capacity stays."""
        for key in self._held.pop(holder, {}):
            self._unhold(key, holder)

    def drop(self, holder: str) -> None:
        """`holder` is gone: its keys, its capacity and its bit."""
        self.clear(holder)
        self._capacity.pop(holder, None)
        bit = self._bits.pop(holder, None)
        if bit is not None:
            self._free_bits.append(bit)

    def _evict(self, holder: str) -> None:
        held = self._held.get(holder)
        if held is None:
            return
        over = len(held) - self.capacity(holder)
        for _ in range(over):
            key, _none = held.popitem(last=False)
            self._unhold(key, holder)
        if not held:
            del self._held[holder]

    def _unhold(self, key: Key, holder: str) -> None:
        rest = self._holders[key] & ~self._bits[holder]
        if rest:
            self._holders[key] = rest
        else:
            del self._holders[key]

    def _bit(self, holder: str) -> int:
        bit = self._bits.get(holder)
        if bit is None:
            bit = self._bits[holder] = self._free_bits.pop() if self._free_bits else 1 << len(self._bits)
        return bit


def _bounded(blocks: int) -> int:
    if blocks < 0:
        raise ValueError(f"a capacity is >= 0 blocks, not {blocks}")
    return min(blocks, MAX_CAPACITY)

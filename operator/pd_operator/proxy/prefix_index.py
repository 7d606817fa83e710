"""Which prefill holds which prompt prefix, block by block: pd-proxy's prefix index. Pure (no I/O,
no clock).

Keys. A prompt's token ids are cut into whole blocks of `block_tokens`, the engine's resolved block
for that member's KV layout (spec/validate.py `Resolved.prefix_hit_tokens`, carried to the proxy by
the membership: proxy/membership.py); a partial last block is never cached by vLLM, so it has no
key. Each block's key chains its parent's key with its own tokens (as vLLM's block hashes do: vllm-
project/vllm: vllm/v1/core/kv_cache_utils.py @ v0.34.0, `hash_block_tokens`), so a key stands for the
whole prefix up to it. The chain starts from a root made of `block_tokens` and the request's
`cache_salt`: requests with different salts, or hashed for layouts of different block sizes, never
share a key. Keys are the proxy's own (BLAKE2b), not vLLM's: vLLM seeds its hashes per process, and
the precise mode (proxy/kv_events.py) turns each engine hash into the proxy's key from the token ids
the event carries.

Holders. A holder is a string: an instance name in approximate mode, an instance's DP rank's
publisher in precise mode (`<instance>/dp<rank>`: each DP rank caches on its own). Per key, the set
of holders; per holder, its keys in least-recently-used order and a capacity in blocks. `hits`
walks a request's keys from the first and stops at the first key none of the candidates holds, so
its cost grows with the request's matched blocks and the candidates, never with what the index
holds; holding, touching and forgetting a key are O(1) each. Memory is bounded: each holder holds at
most its capacity, the oldest key going first (and so a departed or cleared holder frees its keys).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence

Key = bytes
KEY_BYTES = 16
MAX_CAPACITY = 10_000_000
"""A holder never holds more keys than this, whatever its capacity says (about 1.5 GB of index)."""


def block_keys(tokens: Sequence[int], block_tokens: int, salt: str = "") -> list[Key]:
    """The chained keys of the whole `block_tokens` blocks of `tokens` under `salt`."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, not {block_tokens}")
    parent = root_key(block_tokens, salt)
    data = array("q", tokens).tobytes()
    step = block_tokens * 8
    out = []
    for start in range(0, (len(tokens) // block_tokens) * step, step):
        parent = chain_key(parent, data[start:start + step])
        out.append(parent)
    return out


def root_key(block_tokens: int, salt: str) -> Key:
    """Where every chain of `block_tokens` blocks under `salt` starts."""
    return hashlib.blake2b(f"pd-prefix\0{block_tokens}\0{salt}".encode(), digest_size=KEY_BYTES).digest()


def chain_key(parent: Key, block: bytes) -> Key:
    """The key of a block of packed token ids (array('q')) after the block keyed `parent`."""
    return hashlib.blake2b(parent + block, digest_size=KEY_BYTES).digest()


def tokens_key(parent: Key, tokens: Sequence[int]) -> Key:
    """chain_key of a block given as token ids."""
    return chain_key(parent, array("q", tokens).tobytes())


class PrefixIndex:
    """Per key, its holders; per holder, its keys (oldest first) within its capacity."""

    def __init__(self, default_capacity: int) -> None:
        self.default_capacity = _bounded(default_capacity)
        self._holders: dict[Key, set[str]] = {}
        self._held: dict[str, OrderedDict[Key, None]] = {}
        self._capacity: dict[str, int] = {}

    # --- what is held --------------------------------------------------------------------------------

    def hits(self, keys: Sequence[Key], candidates: Iterable[str]) -> dict[str, int]:
        """Per candidate, how many of `keys` it holds from the first on (0: none)."""
        out = dict.fromkeys(candidates, 0)
        alive = set(out)
        for depth, key in enumerate(keys, 1):
            alive &= self._holders.get(key, set())
            if not alive:
                break
            for holder in alive:
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
        for key in keys:
            if key in held:
                held.move_to_end(key)
            else:
                held[key] = None
                self._holders.setdefault(key, set()).add(holder)
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
        """`holder` is gone: its keys and its capacity."""
        self.clear(holder)
        self._capacity.pop(holder, None)

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
        holders = self._holders[key]
        holders.discard(holder)
        if not holders:
            del self._holders[key]


def _bounded(blocks: int) -> int:
    if blocks < 0:
        raise ValueError(f"a capacity is >= 0 blocks, not {blocks}")
    return min(blocks, MAX_CAPACITY)

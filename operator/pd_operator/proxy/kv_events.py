"""Precise prefix routing: the prefill engines' vLLM KV-cache events into the prefix index.

Where from. With spec.proxy.routing.prefix `precise` the operator renders `--kv-events-config` on
every prefill engine (render/command.py), and each prefill's membership entry lists its DP ranks'
publishers (`events`, `tcp://<pod host>:<port + rank>`: proxy/membership.py). pd-proxy subscribes
to each (a ZMQ SUB socket, all topics), one index holder per publisher (`<instance>/dp<rank>`: each
DP rank has its own cache), and drops a publisher's holder when it leaves the membership.

The wire (facts of vllm-project/vllm: vllm/distributed/kv_events.py @ v0.34.0; this decoder is our
own): each message is the multipart `(topic, seq, payload)`, seq an 8-byte big-endian counter from 0
per publisher, payload a msgpack `KVEventBatch`, an array `[ts, events(, data_parallel_rank)]`; each
event a map tagged by `type`: `BlockStored` (block_hashes, parent_block_hash, token_ids,
block_size, lora_name, extra_keys, group_idx, ...), `BlockRemoved` (block_hashes, ...),
`AllBlocksCleared`. Block hashes are ints or bytes, seeded per engine process, so each holder maps
the engine's hashes to the proxy's own keys, computed from the token ids the event carries
(`Feed`); a stored block whose parent the holder does not know (its store was missed) is skipped.

Gaps. A batch whose seq is not the one after the last (dropped by the publisher's high-water mark,
reordered, or a restarted engine counting from 0 again) means the holder may have missed a removal:
its entries are cleared and indexing starts again from that batch (a resync; vLLM's replay socket
is not used). A batch that does not decode is a gap too. Events the proxy cannot key the way it keys
requests are skipped: blocks of another size than the member's `blockTokens` (never re-cut), and
blocks keyed by a LoRA adapter or by multimodal or embedding inputs (requests the proxy routes by
prefix are token ids alone). A block removed from any KV cache group stops being a hit: for a hybrid
model the prefix hits only where every group still holds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from pd_operator.proxy.prefix_index import Key, PrefixIndex, root_key, tokens_key

log = logging.getLogger("pd_operator.proxy")

EngineHash = int | bytes
MAX_PAYLOAD_BYTES = 64 << 20
"""A batch larger than this is not decoded (a gap): what one engine step stores is far smaller."""


@dataclass(frozen=True)
class Stored:
    hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    tokens: tuple[int, ...]
    block_size: int
    keyed_apart: bool
    """Keyed by a LoRA adapter, multimodal or embedding inputs: the proxy cannot key it."""
    salt: str


@dataclass(frozen=True)
class Removed:
    hashes: tuple[EngineHash, ...]


@dataclass(frozen=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


def decode_batch(payload: bytes) -> list[Event]:
    """The events of one KVEventBatch payload; ValueError when it is not one."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"a batch of {len(payload)} bytes")
    try:
        batch = msgspec.msgpack.decode(payload)  # builtins: lists, maps, str, bytes, ints
    except msgspec.DecodeError as err:
        raise ValueError(f"not msgpack: {err}") from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("not a KVEventBatch [ts, events, ...]")
    return [_event(e) for e in batch[1]]


def _event(obj: Any) -> Event:
    if not isinstance(obj, dict):
        raise ValueError(f"an event is a map, not {type(obj).__name__}")
    kind = obj.get("type")
    if kind == "AllBlocksCleared":
        return Cleared()
    hashes = obj.get("block_hashes")
    if not isinstance(hashes, list) or not all(_hash(h) for h in hashes):
        raise ValueError(f"{kind}.block_hashes: a list of ints or bytes")
    if kind == "BlockRemoved":
        return Removed(tuple(hashes))
    if kind != "BlockStored":
        raise ValueError(f"an event of type {kind!r}")
    parent, tokens, size = obj.get("parent_block_hash"), obj.get("token_ids"), obj.get("block_size")
    if parent is not None and not _hash(parent):
        raise ValueError("BlockStored.parent_block_hash: an int, bytes or nil")
    if not isinstance(tokens, list) or not all(_int(t) for t in tokens):
        raise ValueError("BlockStored.token_ids: a list of ints")
    if not isinstance(size, int) or size < 1 or len(tokens) != size * len(hashes):
        raise ValueError("BlockStored.block_size: the tokens of each block")
    extra = obj.get("extra_keys") or []
    if not isinstance(extra, list):
        raise ValueError("BlockStored.extra_keys: a list")
    # vLLM keys a block by, in order: the LoRA name, (mm identifier, offset) pairs, the cache_salt (first
    # block only) and prompt-embedding digests (vllm/v1/core/kv_cache_utils.py @ v0.34.0,
    # generate_block_hash_extra_keys). Without LoRA, a string there is the salt; anything else keys it
    # apart.
    items = [item for keys in extra if keys is not None
             for item in (keys if isinstance(keys, list) else [keys])]
    keyed_apart = obj.get("lora_name") is not None or any(not isinstance(i, str) for i in items)
    salts = [i for i in items if isinstance(i, str)]
    return Stored(tuple(hashes), parent, tuple(tokens), size, keyed_apart or len(salts) > 1,
                  salts[0] if salts else "")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _hash(value: Any) -> bool:
    return _int(value) or isinstance(value, bytes)


class Feed:
    """One publisher's events into the index under `holder`, for blocks of `block_tokens`."""

    def __init__(self, index: PrefixIndex, holder: str, block_tokens: int) -> None:
        self.index, self.holder, self.block_tokens = index, holder, block_tokens
        self.next_seq: int | None = None
        self.resyncs = 0
        self.skipped = 0
        """Stored blocks not indexed (another block size, keyed apart, parent unknown)."""
        self._keys: OrderedDict[EngineHash, Key] = OrderedDict()
        """The engine's hash of each block this holder may hold -> the proxy's key; bounded."""

    def receive(self, seq: int, payload: bytes) -> None:
        """One message of the publisher: a gap in seq, or a payload that does not decode, resyncs."""
        if self.next_seq is not None and seq != self.next_seq:
            log.warning("KV events of %s: batch %d after %d, a gap; resyncing", self.holder, seq,
                        self.next_seq - 1)
            self.resync()
        self.next_seq = seq + 1
        try:
            events = decode_batch(payload)
        except ValueError as err:
            log.warning("KV events of %s: batch %d does not decode (%s); resyncing", self.holder, seq, err)
            self.resync()
            return
        for event in events:
            self.apply(event)

    def resync(self) -> None:
        self.resyncs += 1
        self.clear()

    def clear(self) -> None:
        self.index.clear(self.holder)
        self._keys.clear()

    def apply(self, event: Event) -> None:
        if isinstance(event, Cleared):
            self.clear()
        elif isinstance(event, Removed):
            keys = [k for h in event.hashes if (k := self._keys.pop(h, None)) is not None]
            self.index.remove(self.holder, keys)
        else:
            self._store(event)

    def _store(self, event: Stored) -> None:
        parent = (root_key(self.block_tokens, event.salt) if event.parent is None
                  else self._keys.get(event.parent))
        if event.block_size != self.block_tokens or event.keyed_apart or parent is None:
            self.skipped += len(event.hashes)
            return
        size = event.block_size
        keys = []
        for i, engine_hash in enumerate(event.hashes):
            parent = tokens_key(parent, event.tokens[i * size:(i + 1) * size])
            self._keys[engine_hash] = parent
            self._keys.move_to_end(engine_hash)
            keys.append(parent)
        self.index.store(self.holder, keys)
        # Blocks the index evicted past the holder's capacity can still be named by later events; keep
        # twice that many hashes, the oldest going first.
        while len(self._keys) > 2 * self.index.capacity(self.holder):
            self._keys.popitem(last=False)


def seq_number(frame: bytes) -> int:
    """The batch number of a message's seq frame (8 bytes, big-endian); ValueError otherwise."""
    if len(frame) != 8:
        raise ValueError(f"a seq frame of {len(frame)} bytes")
    return int.from_bytes(frame, "big", signed=True)


class Subscriptions:
    """One SUB socket per publisher `feeds` names, each feeding its Feed while it is listed."""

    def __init__(self, context_factory: Callable[[], Any] | None = None) -> None:
        self._tasks: dict[tuple[str, str, int], tuple[Feed, asyncio.Task]] = {}
        self._context_factory = context_factory

    def follow(self, feeds: dict[tuple[str, str, int], Feed]) -> None:
        """Subscribe to every (endpoint, holder, block) of `feeds` not subscribed yet, each feeding
        its Feed; close the rest. Needs a running event loop."""
        for key in [k for k, (feed, _) in self._tasks.items() if feeds.get(k) is not feed]:
            self._tasks.pop(key)[1].cancel()
        for key, feed in feeds.items():
            if key not in self._tasks:
                task = asyncio.get_running_loop().create_task(self._run(key[0], feed))
                self._tasks[key] = (feed, task)

    @property
    def endpoints(self) -> list[str]:
        return sorted(key[0] for key in self._tasks)

    def close(self) -> None:
        self.follow({})

    async def _run(self, endpoint: str, feed: Feed) -> None:
        import zmq
        import zmq.asyncio

        context = self._context_factory() if self._context_factory else zmq.asyncio.Context.instance()
        sock = context.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD_BYTES + 1024)
        sock.connect(endpoint)
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    if len(frames) != 3:
                        raise ValueError(f"{len(frames)} frames, not (topic, seq, payload)")
                    seq = seq_number(frames[1])
                except ValueError as err:
                    log.warning("KV events of %s: a malformed message (%s); resyncing", feed.holder, err)
                    feed.resync()
                    feed.next_seq = None
                    continue
                feed.receive(seq, frames[2])
        finally:
            sock.close(linger=0)
            feed.clear()

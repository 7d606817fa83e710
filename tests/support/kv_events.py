"""vLLM's KV-cache events as they go over the wire, and a publisher process that sends them.

The format (vllm-project/vllm: vllm/distributed/kv_events.py @ v0.34.0, read in .vllm-venv; our own
code, none of theirs):
- a `KVEventBatch` is a msgpack array `[ts, events, data_parallel_rank]` (msgspec `array_like`;
  the rank is left out when it is None);
- each event is a msgpack map tagged `"type": <class name>`: `BlockStored` (block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, lora_name always; extra_keys,
  group_idx, ... only when not their default), `BlockRemoved` (block_hashes, medium; group_idx when
  set), `AllBlocksCleared` (nothing else);
- block hashes are 64-bit integers by default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`,
  vllm/envs.py) or bytes;
- the PUB socket sends each batch as a multipart message `(topic, seq, payload)`, seq an 8-byte
  big-endian counter from 0; a ROUTER socket answers a replay request `(start_seq as 8 bytes)` with
  every buffered batch from that seq as `(topic, seq, payload)` and then an end marker
  `(b"", seq -1, b"")`.

`Publisher` runs the sending side in a process of its own (`python kv_events.py --serve`), as vLLM's
publisher runs apart from the engine's scheduler: the engine hands it encoded batches through a
pipe. A test makes the wire misbehave from events, never sleeps: `drop(n)` (the next n batches are
numbered and kept for replay but never sent, as a PUB socket past its high-water mark drops them),
`hold(n)` then `release()` (delay; a batch sent after a later one is a reordering).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

END_SEQ = -1
"""The seq of the replay's end marker."""
MEDIUM_GPU = "GPU"
"""The medium vLLM's block pool reports for device blocks (vllm/v1/core/block_pool.py)."""

BlockHash = int | bytes


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = MEDIUM_GPU
    lora_id: int | None = None
    lora_name: str | None = None
    extra_keys: list[tuple | None] | None = None
    """One entry per block: the cache_salt on a request's first block (vLLM: to_event_extra_keys)."""
    group_idx: int | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class Batch:
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


def _event_map(event: Event) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        out: dict[str, Any] = {
            "type": "BlockStored", "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash, "token_ids": list(event.token_ids),
            "block_size": event.block_size, "lora_id": event.lora_id, "medium": event.medium,
            "lora_name": event.lora_name}
        if event.extra_keys is not None:
            out["extra_keys"] = [None if k is None else list(k) for k in event.extra_keys]
        if event.group_idx is not None:
            out["group_idx"] = event.group_idx
        return out
    if isinstance(event, BlockRemoved):
        out = {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": event.medium}
        if event.group_idx is not None:
            out["group_idx"] = event.group_idx
        return out
    return {"type": "AllBlocksCleared"}


def encode(batch: Batch) -> bytes:
    fields: list[Any] = [batch.ts, [_event_map(e) for e in batch.events]]
    if batch.data_parallel_rank is not None:
        fields.append(batch.data_parallel_rank)
    return msgpack.packb(fields, use_bin_type=True)


def _event(obj: dict[str, Any]) -> Event:
    kind = obj.get("type")
    if kind == "BlockStored":
        keys = obj.get("extra_keys")
        return BlockStored(list(obj["block_hashes"]), obj["parent_block_hash"], list(obj["token_ids"]),
                           obj["block_size"], obj["medium"], obj["lora_id"], obj["lora_name"],
                           None if keys is None else [None if k is None else tuple(k) for k in keys],
                           obj.get("group_idx"))
    if kind == "BlockRemoved":
        return BlockRemoved(list(obj["block_hashes"]), obj["medium"], obj.get("group_idx"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV event type {kind!r}")


def decode(payload: bytes) -> Batch:
    """A batch from its msgpack bytes; ValueError when it is not one."""
    fields = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(fields, list) or len(fields) not in (2, 3) or not isinstance(fields[1], list):
        raise ValueError(f"not a KVEventBatch: {fields!r:.200}")
    return Batch(float(fields[0]), [_event(e) for e in fields[1]], fields[2] if len(fields) == 3 else None)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


# --- the publisher process -------------------------------------------------------------------------

_FRAME = struct.Struct(">cI")
PUBLISH, DROP, HOLD, RELEASE = b"P", b"D", b"H", b"R"


def _serve(endpoint: str, replay_endpoint: str, topic: bytes) -> None:
    """The publisher process: frames from stdin (`_FRAME` then the body), one line on stdout per frame
    once it took effect ("seq N" for a batch, "ok" for a command)."""
    import zmq

    ctx = zmq.Context()
    pub, replay = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub.bind(endpoint)
    replay.bind(replay_endpoint)
    sent: list[tuple[int, bytes]] = []
    held: list[tuple[int, bytes]] = []
    drop = hold = 0
    stdin = sys.stdin.buffer
    print("ready", flush=True)
    poller = zmq.Poller()
    poller.register(replay, zmq.POLLIN)
    poller.register(stdin.fileno(), zmq.POLLIN)
    while True:
        ready = dict(poller.poll())
        if replay in ready:
            client, _, start = replay.recv_multipart()
            for seq, payload in sent:
                if seq >= seq_of(start):
                    replay.send_multipart((client, b"", topic, seq_bytes(seq), payload))
            replay.send_multipart((client, b"", b"", seq_bytes(END_SEQ), b""))
        if stdin.fileno() not in ready:
            continue
        header = stdin.read(_FRAME.size)
        if len(header) < _FRAME.size:
            break
        op, size = _FRAME.unpack(header)
        body = stdin.read(size)
        if op == PUBLISH:
            seq = len(sent)
            sent.append((seq, body))
            if drop:
                drop -= 1
            elif hold:
                hold -= 1
                held.append((seq, body))
            else:
                pub.send_multipart((topic, seq_bytes(seq), body))
            print(f"seq {seq}", flush=True)
            continue
        if op == DROP:
            drop += int(body)
        elif op == HOLD:
            hold += int(body)
        elif op == RELEASE:
            for seq, payload in held:
                pub.send_multipart((topic, seq_bytes(seq), payload))
            held.clear()
        print("ok", flush=True)
    pub.close(linger=0)
    replay.close(linger=0)
    ctx.term()


class Publisher:
    """A publisher process on `host`: PUB at `port`, replay ROUTER at `replay_port`."""

    def __init__(self, host: str, port: int, replay_port: int, topic: str = "") -> None:
        self.endpoint = f"tcp://{host}:{port}"
        self.replay_endpoint = f"tcp://{host}:{replay_port}"
        self.topic = topic
        self.proc: subprocess.Popen | None = None
        self.last_seq = -1

    def start(self) -> Publisher:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", self.endpoint,
                                      self.replay_endpoint, self.topic],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self._line() != "ready":
            raise RuntimeError(f"KV event publisher at {self.endpoint} did not start")
        return self

    def _line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line:
            raise RuntimeError(f"KV event publisher at {self.endpoint} exited ({self.proc.poll()})")
        return line

    def _send(self, op: bytes, body: bytes) -> str:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(_FRAME.pack(op, len(body)) + body)
        self.proc.stdin.flush()
        return self._line()

    def publish(self, events: Iterable[Event], ts: float = 0.0, data_parallel_rank: int = 0) -> int:
        """Send one batch (or keep it, as `drop`/`hold` say); its seq."""
        return self.publish_bytes(encode(Batch(ts, list(events), data_parallel_rank)))

    def publish_bytes(self, payload: bytes) -> int:
        self.last_seq = int(self._send(PUBLISH, payload).split()[1])
        return self.last_seq

    def drop(self, n: int = 1) -> None:
        self._send(DROP, str(n).encode())

    def hold(self, n: int = 1) -> None:
        self._send(HOLD, str(n).encode())

    def release(self) -> None:
        self._send(RELEASE, b"")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a dead engine pod."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Publisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Wire:
    """The test's own ends of a publisher: a SUB socket on its PUB endpoint and a DEALER on its replay
    endpoint, giving raw `(topic, seq, payload)` messages as they arrive."""

    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        import zmq

        self._zmq = zmq
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint

    def receive(self, timeout_s: float = 30.0) -> tuple[bytes, int, bytes] | None:
        """The next message the SUB socket got (None: none within the deadline)."""
        if not self.sub.poll(int(timeout_s * 1000)):
            return None
        topic, seq, payload = self.sub.recv_multipart()
        return topic, seq_of(seq), payload

    def replay(self, start: int, timeout_s: float = 30.0) -> list[tuple[bytes, int, bytes]]:
        """Every buffered message from seq `start`, as the replay socket answers, up to its end marker."""
        dealer = self.ctx.socket(self._zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart((b"", seq_bytes(start)))
            out = []
            while True:
                if not dealer.poll(int(timeout_s * 1000)):
                    raise TimeoutError(f"no end marker from {self.replay_endpoint}")
                _, topic, seq, payload = dealer.recv_multipart()
                if seq_of(seq) == END_SEQ:
                    return out
                out.append((topic, seq_of(seq), payload))
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.ctx.destroy(linger=0)

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    _serve(sys.argv[2], sys.argv[3], sys.argv[4].encode() if len(sys.argv) > 4 else b"")

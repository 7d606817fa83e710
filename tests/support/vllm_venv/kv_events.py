"""vLLM 0.34's own KV-event classes and ZMQ publisher, for the contract tier (run with .vllm-venv's python;
never imported by the tests). One command per run, its results as JSON lines on stdout:

- `decode`: stdin is a JSON list of hex payloads; each is decoded with vLLM's msgspec decoder for
  `KVEventBatch` and printed as builtins (a payload vLLM refuses prints {"refused": why});
- `encode`: stdin is a JSON list of batches as builtins; each is built from vLLM's classes and
  printed as {"hex": msgspec's msgpack of it};
- `publish ENDPOINT REPLAY`: vLLM's ZmqEventPublisher binds there; each stdin line (a batch as
  builtins) is published; "ok" after each, once sent.
"""

from __future__ import annotations

import json
import sys
import time

import msgspec
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

DECODER = msgspec.msgpack.Decoder(KVEventBatch)
KINDS = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def builtins(batch: KVEventBatch) -> dict:
    return {"ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank,
            "events": [{"type": type(e).__name__, **msgspec.to_builtins(e)} for e in batch.events]}


def build(obj: dict) -> KVEventBatch:
    events = []
    for e in obj["events"]:
        fields = {k: v for k, v in e.items() if k != "type"}
        if "extra_keys" in fields and fields["extra_keys"] is not None:
            fields["extra_keys"] = [None if k is None else tuple(k) for k in fields["extra_keys"]]
        events.append(KINDS[e["type"]](**fields))
    return KVEventBatch(ts=obj["ts"], events=events, data_parallel_rank=obj.get("data_parallel_rank"))


def emit(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def decode() -> None:
    for payload in json.load(sys.stdin):
        try:
            emit(builtins(DECODER.decode(bytes.fromhex(payload))))
        except msgspec.DecodeError as err:
            emit({"refused": str(err)})


def encode() -> None:
    encoder = msgspec.msgpack.Encoder()
    for obj in json.load(sys.stdin):
        emit({"hex": encoder.encode(build(obj)).hex()})


def publish(endpoint: str, replay_endpoint: str) -> None:
    publisher = ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay_endpoint)
    emit({"bound": True})
    for line in sys.stdin:
        publisher.publish(build(json.loads(line)))
        while not publisher._event_queue.empty():
            time.sleep(0.01)
        emit("ok")
    publisher.shutdown()


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "decode":
        decode()
    elif command == "encode":
        encode()
    elif command == "publish":
        publish(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown command {command!r}")

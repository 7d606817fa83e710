"""The caching fakes' KV events against vLLM 0.34's own event classes and publisher (in .vllm-venv):
our bytes decode with vLLM's msgspec decoder to the same events; vLLM's bytes decode with ours and
with pd-proxy's own decoder (proxy/kv_events.py); our
publisher process frames, numbers and replays batches as vLLM's `ZmqEventPublisher` does, read by
the same test-side sockets (tests/support/kv_events.py). Runs vLLM's code as a program
(tests/support/vllm_venv/kv_events.py), never imported here."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from dataclasses import asdict

import pytest

from pd_operator.proxy import kv_events as proxy_events
from support.caching_engine import PrefixCache, block_hashes
from support.cluster import pick_port
from support.fakevllm import HOST
from support.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    Batch,
    BlockRemoved,
    BlockStored,
    Event,
    Publisher,
    Wire,
    decode,
    encode,
)
from support.vllm_tier import VLLM_PYTHON, vllm_venv_program

pytestmark = pytest.mark.contract

BIG_HASH = 2**64 - 5
"""vLLM's integer block hashes use all 64 bits (vllm/v1/core/kv_cache_utils.py)."""


def batches() -> list[Batch]:
    """What the fakes publish: a cache's stores (salted too) and evictions, a clear, and the edges
    of the format (64-bit hashes, byte hashes, a rank of None)."""
    cache = PrefixCache(4, 3)
    prompt = list(range(12))
    stored = cache.admit(block_hashes(prompt, 4, "s"), prompt, "s").events
    more = cache.admit(block_hashes(prompt[:4] + [99] * 8, 4), prompt[:4] + [99] * 8).events
    return [
        Batch(1.25, stored, 0),
        Batch(2.5, more, 1),
        Batch(3.0, [BlockStored([BIG_HASH], BIG_HASH - 1, [1, 2], 2, lora_id=3, lora_name="adapter"),
                    BlockRemoved([b"\x00\xff" * 16], medium=None), AllBlocksCleared()], None),
    ]


def as_builtins(batch: Batch) -> dict:
    """A batch as vLLM's program prints one (msgspec.to_builtins: bytes as base64 there, hex here)."""
    def event(e: Event) -> dict:
        fields = asdict(e)
        if not fields:
            return {"type": type(e).__name__}
        if "extra_keys" in fields and fields["extra_keys"] is not None:
            fields["extra_keys"] = [None if k is None else list(k) for k in fields["extra_keys"]]
        fields["block_hashes"] = [h.hex() if isinstance(h, bytes) else h for h in fields["block_hashes"]]
        return {"type": type(e).__name__, **fields}
    return {"ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank,
            "events": [event(e) for e in batch.events]}


def vllm(command: str, stdin: str) -> list:
    done = subprocess.run([str(VLLM_PYTHON), str(vllm_venv_program("kv_events.py")), command], input=stdin,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def normalised(obj: dict) -> dict:
    """vLLM's builtins with base64 byte hashes as hex, comparable to ours."""
    events = []
    for e in obj["events"]:
        e = dict(e)
        if "block_hashes" in e:
            e["block_hashes"] = [base64.b64decode(h).hex() if isinstance(h, str) else h
                                 for h in e["block_hashes"]]
        events.append(e)
    return {**obj, "events": events}


def test_vllm_decodes_our_batches_to_the_same_events():
    ours = batches()
    decoded = vllm("decode", json.dumps([encode(b).hex() for b in ours]))
    assert all("refused" not in d for d in decoded), decoded
    for got, want in zip(decoded, ours, strict=True):
        got = normalised(got)
        mine = as_builtins(want)
        assert got["ts"] == mine["ts"] and got["data_parallel_rank"] == mine["data_parallel_rank"]
        for theirs, ours_event in zip(got["events"], mine["events"], strict=True):
            # vLLM's classes have more optional fields (session_id, locality, ...): ours are a subset,
            # each equal; theirs beyond ours hold their defaults.
            assert {k: theirs.get(k) for k in ours_event} == ours_event
            assert all(theirs[k] is None for k in set(theirs) - set(ours_event)), theirs


def test_vllm_refuses_a_batch_with_an_unknown_event():
    bad = encode(Batch(0.0, [AllBlocksCleared()])).replace(b"AllBlocksCleared", b"AllBlocksCleareX")
    (answer,) = vllm("decode", json.dumps([bad.hex()]))
    assert "refused" in answer


def test_we_decode_vllm_encoded_batches_to_the_same_events():
    ours = batches()[:2]  # integer hashes only: the program gets its batches as JSON
    encoded = vllm("encode", json.dumps([as_builtins(b) for b in ours]))
    assert [decode(bytes.fromhex(e["hex"])) for e in encoded] == ours


@pytest.fixture
def vllm_publisher() -> Iterator[tuple[subprocess.Popen, str, str]]:
    port, replay = pick_port(HOST), f"tcp://{HOST}:{pick_port(HOST)}"
    # vLLM binds its PUB socket only to a wildcard address (it connects to any other).
    proc = subprocess.Popen([str(VLLM_PYTHON), str(vllm_venv_program("kv_events.py")), "publish",
                             f"tcp://*:{port}", replay],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and json.loads(proc.stdout.readline()) == {"bound": True}
        yield proc, f"tcp://{HOST}:{port}", replay
    finally:
        proc.kill()
        proc.wait()


def frames_of(send, wire: Wire, batches_: list[Batch]) -> tuple[list, list]:
    """(live messages after the subscriber joined, the replay from seq 0) for `batches_` sent by
    `send`; empty batches go first until the SUB socket gets one."""
    for _ in range(200):
        send(Batch(0.0, [], 0))
        if wire.receive(0.05) is not None:
            break
    else:
        raise AssertionError("the subscriber never joined")
    while wire.receive(0.2) is not None:
        pass
    for batch in batches_:
        send(batch)
    live = [wire.receive() for _ in batches_]
    return live, wire.replay(0)


def test_our_publisher_frames_numbers_and_replays_as_vllms(vllm_publisher):
    proc, endpoint, replay = vllm_publisher
    assert proc.stdin is not None and proc.stdout is not None
    sent = batches()[:2]

    def vllm_send(batch: Batch) -> None:
        proc.stdin.write(json.dumps(as_builtins(batch)) + "\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == "ok"

    with Wire(endpoint, replay) as wire:
        theirs_live, theirs_replay = frames_of(vllm_send, wire, sent)
    with Publisher(HOST, pick_port(HOST), pick_port(HOST)) as pub, \
            Wire(pub.endpoint, pub.replay_endpoint) as wire:
        ours_live, ours_replay = frames_of(lambda b: pub.publish_bytes(encode(b)), wire, sent)

    for live, replayed in ((theirs_live, theirs_replay), (ours_live, ours_replay)):
        assert all(m is not None for m in live)
        assert [m[0] for m in live] == [b"", b""], "the default topic is empty"
        seqs = [m[1] for m in live]
        assert seqs == [seqs[0], seqs[0] + 1], "consecutive seqs"
        assert [decode(m[2]) for m in live] == sent
        assert [m[1] for m in replayed] == list(range(seqs[1] + 1)), "the replay from 0 is every seq sent"
        assert [decode(m[2]) for m in replayed[-2:]] == sent
    assert END_SEQ == -1


def test_the_proxys_decoder_reads_vllm_encoded_batches():
    """pd-proxy's own decoder (proxy/kv_events.py) on what vLLM's encoder makes of the fakes' batches:
    the stores with their tokens, parent and salt, the evictions, as the fakes meant them."""
    ours = batches()[:2]
    encoded = vllm("encode", json.dumps([as_builtins(b) for b in ours]))
    for got, want in zip((proxy_events.decode_batch(bytes.fromhex(e["hex"])) for e in encoded), ours,
                         strict=True):
        expected: list[proxy_events.Event] = []
        for event in want.events:
            if isinstance(event, BlockStored):
                salts = [k[0] for k in event.extra_keys or [] if k is not None]
                expected.append(proxy_events.Stored(tuple(event.block_hashes), event.parent_block_hash,
                                                    tuple(event.token_ids), event.block_size, False,
                                                    salts[0] if salts else ""))
            elif isinstance(event, BlockRemoved):
                expected.append(proxy_events.Removed(tuple(event.block_hashes)))
        assert got == expected

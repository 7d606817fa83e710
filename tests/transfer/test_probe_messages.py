"""Whatever a peer sends, `pd-kv-probe` answers with an error and keeps working.

The decode side's gate fetches each prefill peer's descriptor over HTTP; a gate that raised on one
would crash its container and restart the whole multi-pod instance. Generated peer messages (JSON
scalars, missing and mistyped fields, huge and negative numbers, regions outside the buffer, deep
nesting, bytes that are not JSON or not even HTTP) go through the real fetch, parse, fingerprint,
handshake, pull and verify of `Checker.check`, served by a local HTTP server; the engine is an
in-process stand-in that copies only inside the real prefill arena. After them the same checker
links a genuine peer. A subset also goes to the real `pd-kv-probe gate` process (Mooncake engine
and all) over its socket, which must still answer /link and then link a real `pd-kv-probe serve`.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pd_operator.kv import presets
from pd_operator.kv.side import Side
from pd_operator.spec.pairing import PairInput
from pd_operator.transfer.engine import EngineError
from pd_operator.transfer.probe_check import Checker, ProbeFailure, parse_descriptor
from pd_operator.transfer.probe_geometry import probe_geometry
from pd_operator.transfer.probe_serve import DESCRIPTOR_PATH, descriptor, prefill_arena
from support.cluster import pick_port
from support.kv_probe import LOOPBACK, PROBE, env, serve

MODEL = presets.get("glm-5.3-flash")
GEO = probe_geometry(PairInput(Side("prefill", MODEL, 2), Side("decode", MODEL, 1)))
SEGMENT = "127.0.0.1:1"  # nothing listens: a handshake with it is refused at once
MESSAGES = 10_000
PROCESS_MESSAGES = 300


class LoopbackEngine:
    """The engine a Checker reads with, inside this process: the one segment it knows is the prefill
    arena below, and it copies only runs that lie wholly inside it (anything else fails as an
    engine call does: -1)."""

    def __init__(self, segment: str, memory: Any) -> None:
        self.segment, self.memory = segment, memory
        self.base, self.size = int(memory.ctypes.data), len(memory)
        self.reads = 0

    def register(self, addr: int, nbytes: int) -> None:
        pass

    def first_buffer(self, segment: str) -> int:
        if segment != self.segment:
            raise EngineError(f"no segment {segment}")
        return self.base

    def read(self, segment: str, local: list[int], remote: list[int], lengths: list[int]) -> int:
        self.reads += 1
        if segment != self.segment or any(not (self.base <= r and r + n <= self.base + self.size)
                                          for r, n in zip(remote, lengths, strict=True)):
            return -1
        for dst, src, n in zip(local, remote, lengths, strict=True):
            ctypes.memmove(dst, src, n)
        return 0


MEMORY, PUBLISHED = prefill_arena(GEO)
ENGINE = LoopbackEngine(SEGMENT, MEMORY)
GENUINE = descriptor(ENGINE, MEMORY, PUBLISHED, GEO)  # type: ignore[arg-type]


# --- generated peer messages ---------------------------------------------------------------------

LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                 st.sampled_from([-1, 0, 2**63, 2**64, 2**64 + 1, 10**30]), st.text(max_size=12))
ANY_JSON = st.recursive(LEAF, lambda kids: st.lists(kids, max_size=4)
                        | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=10)
TOP_KEYS = sorted(GENUINE)
REGION_KEYS = sorted(GENUINE["regions"][0])


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """The genuine descriptor with one to three things wrong with it."""
    doc = json.loads(json.dumps(GENUINE))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["drop", "replace", "region-drop", "region-replace", "region-extra",
                                    "region-duplicate", "region-shift", "regions-cut"]))
        regions = doc.get("regions") if isinstance(doc.get("regions"), list) else None
        if how == "drop":
            doc.pop(draw(st.sampled_from(TOP_KEYS)), None)
        elif how == "replace":
            doc[draw(st.sampled_from(TOP_KEYS))] = draw(ANY_JSON)
        elif regions and isinstance(region := regions[draw(st.integers(0, len(regions) - 1))], dict):
            if how == "region-drop":
                region.pop(draw(st.sampled_from(REGION_KEYS)), None)
            elif how == "region-replace":
                region[draw(st.sampled_from(REGION_KEYS))] = draw(ANY_JSON)
            elif how == "region-extra":
                regions.append(draw(ANY_JSON))
            elif how == "region-duplicate":
                regions.append(dict(region))
            elif how == "region-shift":  # an address or length just past (or inside) the buffer
                key = draw(st.sampled_from(["address", "bytes"]))
                if isinstance(region.get(key), int):
                    region[key] += draw(st.sampled_from([-1, 1, GENUINE["bytes"], -GENUINE["base"] - 1]))
            else:
                del regions[draw(st.integers(0, len(regions) - 1)):]
    return _dumps(doc)


PEER_MESSAGES = st.one_of(
    mutated(),
    ANY_JSON.map(_dumps),  # scalars, lists, objects of anything
    st.builds(lambda d: _dumps({k: v for k, v in GENUINE.items() if k != "regions"} | d),
              st.dictionaries(st.sampled_from(TOP_KEYS), ANY_JSON, max_size=3)),
    st.binary(max_size=64),
    st.integers(1, 200).map(lambda cut: _dumps(GENUINE)[:cut]),  # a truncated answer
    st.sampled_from([b"[" * 100_000, b"{\"segment\": " * 50_000, b"1" * 5_000, b"\xff\xfe{}", b"",
                     b"NaN", b"null", b"[]", b"\"segment\"", _dumps(GENUINE) + b"garbage"]),
)


# --- a peer that says whatever the test wants -------------------------------------------------------

@dataclass
class FuzzPeer:
    """A local HTTP server answering every request with the next message (raw: not even HTTP for
    `raw=True` messages), counting what it served."""

    messages: list[tuple[bytes, bool]] = field(default_factory=list)
    served: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self) -> tuple[bytes, bool]:
        with self.lock:
            message = self.messages[self.served % len(self.messages)] if self.messages else (b"", False)
            self.served += 1
            return message

    def start(self) -> tuple[ThreadingHTTPServer, str]:
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body, raw = peer.next()
                if raw:
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"127.0.0.1:{server.server_port}"


@pytest.fixture(scope="module")
def fuzz_peer() -> Iterator[tuple[FuzzPeer, str]]:
    peer = FuzzPeer()
    server, address = peer.start()
    yield peer, address
    server.shutdown()
    server.server_close()


@dataclass
class Tally:
    checked: int = 0
    parsed: int = 0
    refused: int = 0
    uncaught: list[str] = field(default_factory=list)


def test_the_genuine_descriptor_parses_to_its_regions():
    desc = parse_descriptor(_dumps(GENUINE))
    assert (desc.segment, desc.base, desc.bytes) == (SEGMENT, GENUINE["base"], GENUINE["bytes"])
    assert sum(len(p.regions) for p in desc.peers.values()) == len(PUBLISHED)


@pytest.mark.parametrize(("message", "says"), [
    (b"42", "not a JSON object"), (b"\"x\"", "not a JSON object"), (b"{}", "segment None"),
    (_dumps({**GENUINE, "segment": 7}), "segment 7"), (_dumps({**GENUINE, "base": -1}), "base -1"),
    (_dumps({**GENUINE, "bytes": 2**70}), "bytes 1180591620717411303424"),
    (_dumps({**GENUINE, "regions": [{**GENUINE["regions"][0], "address": GENUINE["base"] - 1}]}),
     "regions[0].address"),
    (b"[" * 100_000, "not JSON"), (b"\xff", "not JSON"),
])
def test_a_bad_message_is_refused_saying_what_is_wrong(message, says):
    with pytest.raises(ProbeFailure, match="the peer's descriptor") as err:
        parse_descriptor(message)
    assert says in str(err.value) and len(str(err.value)) < 400


def test_generated_peer_messages_never_escape_the_check(fuzz_peer):
    peer, address = fuzz_peer
    checker = Checker(GEO, ENGINE)  # type: ignore[arg-type]
    tally = Tally()

    @settings(max_examples=MESSAGES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(PEER_MESSAGES, st.booleans())
    def one(message: bytes, raw: bool) -> None:
        tally.checked += 1
        try:
            parse_descriptor(message)
            tally.parsed += 1
        except ProbeFailure:
            tally.refused += 1
        except Exception as err:  # noqa: BLE001 (what the test counts)
            tally.uncaught.append(f"parse: {type(err).__name__}: {err}"[:300])
        peer.messages = [(message, raw and tally.checked % 10 == 0)]  # every tenth not even HTTP
        try:
            result = checker.check(address, timeout=5)
        except Exception as err:  # noqa: BLE001
            tally.uncaught.append(f"check: {type(err).__name__}: {err}"[:300])
            return
        assert result["errors"] or result["ok"], result
        assert len(json.dumps(result)) < 100_000  # what the gate publishes stays small

    one()
    print(f"peer messages: {tally.checked}, parsed {tally.parsed}, refused {tally.refused}, "
          f"uncaught {len(tally.uncaught)}, engine reads {ENGINE.reads}")
    assert tally.checked >= MESSAGES and not tally.uncaught, tally.uncaught[:5]
    assert tally.refused > MESSAGES // 2 and tally.parsed > MESSAGES // 100  # both kinds were generated
    # Still answering, and still right: the genuine peer links.
    peer.messages = [(_dumps(GENUINE), False)]
    result = checker.check(address, timeout=5)
    assert result["ok"] and result["bytes"] == GEO.request.plan.bytes, result


# --- one prefill, every decode block size of its decode TP ---------------------------------------------

GLM_P8_D4 = probe_geometry(PairInput(Side("prefill", MODEL, 8), Side("decode", MODEL, 4)))


@pytest.fixture(scope="module")
def glm_p8_d4() -> tuple[dict, LoopbackEngine]:
    """The descriptor of a prefill rendered for decode TP4 at engine block 1152, and its engine."""
    memory, published = prefill_arena(GLM_P8_D4)
    eng = LoopbackEngine(SEGMENT, memory)
    return descriptor(eng, memory, published, GLM_P8_D4), eng  # type: ignore[arg-type]


def decode_of(tp: int, block: int | None = None):
    return probe_geometry(PairInput(Side("prefill", MODEL, 8), Side("decode", MODEL, tp, block_size=block)))


@pytest.mark.parametrize("block", [1280, 4352])
def test_a_checker_for_another_decode_block_size_links_the_same_prefill(fuzz_peer, glm_p8_d4, block):
    """The served buffer depends on the prefill side alone: a decode of another engine block size (a
    decode-only change) checks the unchanged prefill by its own plan, every byte."""
    peer, address = fuzz_peer
    served, eng = glm_p8_d4
    other = decode_of(4, block)
    assert other.decode.engine_block_size == block != GLM_P8_D4.decode.engine_block_size
    peer.messages = [(_dumps(served), False)]
    result = Checker(other, eng).check(address, timeout=5)  # type: ignore[arg-type]
    assert (result["ok"], result["errors"]) == (True, []), result
    assert (result["entries"], result["bytes"]) == (other.request.plan.entries, other.request.plan.bytes)


def test_a_checker_of_another_decode_tp_refuses_the_prefill(fuzz_peer, glm_p8_d4):
    """A prefill engine chooses the ranks that wait for a pull by decode's TP: decode TP8 (prefill's
    own engine block, 640) may not use a prefill told TP4."""
    peer, address = fuzz_peer
    served, eng = glm_p8_d4
    peer.messages = [(_dumps(served), False)]
    result = Checker(decode_of(8), eng).check(address, timeout=5)  # type: ignore[arg-type]
    assert result["errors"] == ["the peer serves another pairing: decode.tensorParallelSize: this side "
                                "has 8, the peer 4"], result


def test_an_earlier_serving_sides_descriptor_links_by_its_prefill_side(fuzz_peer, glm_p8_d4):
    """Probes before this one also published decode's block size and the plan: a prefill still running
    them (its template unchanged) links a new decode of another block size."""
    peer, address = fuzz_peer
    served, eng = glm_p8_d4
    other = decode_of(4, 2304)
    plan = GLM_P8_D4.request.plan
    earlier = {**served, "geometry": {**served["geometry"], "decode": {"tensorParallelSize": 4,
                                                                       "engineBlockSize": 1152},
                                      "entries": plan.entries, "bytes": plan.bytes}}
    peer.messages = [(_dumps(earlier), False)]
    result = Checker(other, eng).check(address, timeout=5)  # type: ignore[arg-type]
    assert (result["ok"], result["bytes"]) == (True, other.request.plan.bytes), result


def test_a_prefill_of_another_buffer_layout_is_refused_by_its_regions(fuzz_peer):
    """What the prefill fingerprint does not name (cache dtype, pool, widths) is checked by the
    regions' sizes, before any pull."""
    peer, address = fuzz_peer
    region = GENUINE["regions"][0]
    shrunk = {**GENUINE, "regions": [{**region, "bytes": region["bytes"] - 1}, *GENUINE["regions"][1:]]}
    peer.messages = [(_dumps(shrunk), False)]
    reads = ENGINE.reads
    result = Checker(GEO, ENGINE).check(address, timeout=5)  # type: ignore[arg-type]
    key = (region["group"], region["component"], region["layer"])
    assert not result["ok"] and ENGINE.reads == reads, result
    size = region["bytes"]
    assert result["errors"] == [f"the peer serves another pairing: prefill rank {region['rank']}: region "
                                f"{key} is {size} bytes on this side, the peer {size - 1}"]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.transfer
def test_the_gate_process_keeps_answering_and_then_links(fuzz_peer):
    """The real `pd-kv-probe gate` (its own Mooncake engine) checks the fuzz peer round after round;
    then the fuzz peer hands out a real `pd-kv-probe serve`'s descriptor and the same gate links it."""
    peer, address = fuzz_peer
    pairing = ["--model", "glm-5.3-flash", "--prefill-tp", "2", "--decode-tp", "1"]
    sample: list[tuple[bytes, bool]] = []

    @settings(max_examples=PROCESS_MESSAGES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(PEER_MESSAGES, st.booleans())
    def collect(message: bytes, raw: bool) -> None:
        sample.append((message, raw))

    collect()
    real, real_peer = serve(pairing)
    with urllib.request.urlopen(f"http://{real_peer}{DESCRIPTOR_PATH}", timeout=10) as answer:
        genuine = answer.read()
    port = pick_port()
    peer.messages, peer.served = sample, 0
    gate = subprocess.Popen([*PROBE, "gate", *pairing, *LOOPBACK, "--host", "127.0.0.1", "--port", str(port),
                             "--peer", address, "--every", "0.01", "--timeout", "5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())

    def answering(path: str) -> tuple[int, dict]:
        """The gate's answer once it has one, failing if the gate process is gone."""
        while True:
            assert gate.poll() is None, f"the gate exited: {gate.returncode} {gate.stderr.read()[-2000:]}"
            try:
                return _get(f"http://127.0.0.1:{port}{path}")
            except (OSError, ValueError):
                time.sleep(0.05)  # not listening yet

    try:
        while peer.served < len(sample) + 1:  # every message fetched, and the round after the last
            status, last = answering("/link")
            time.sleep(0.05)
        status, last = answering("/link")
        assert status == 200 and last["ok"] is False and last["peers"][0]["errors"], last
        assert answering("/ready")[0] == 503
        switched = peer.served
        peer.messages = [(genuine, False)]
        while peer.served < switched + 2:  # the round of a genuine answer has completed
            time.sleep(0.05)
        status, last = answering("/ready")
        assert status == 200 and last["ok"] and last["peers"][0]["bytes"] > 0, last
        print(f"gate process: {len(sample)} generated peer messages, {peer.served} rounds, alive, linked")
    finally:
        gate.terminate()
        gate.wait(10)
        real.terminate()
        real.wait(10)

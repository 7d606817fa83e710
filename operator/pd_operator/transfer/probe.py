"""`pd-kv-probe`: prove a prefill/decode KV link works before serving traffic (a readiness gate).

    pd-kv-probe serve --port 8090 PAIRING                     (prefill side; stays up)
    pd-kv-probe check --peer HOST:8090 PAIRING                (one check; exit 0 ok, 1 failed)
    pd-kv-probe gate --port 8090 --every 30 --config FILE     (decode side; stays up)

PAIRING is `--config FILE` (a PDDeployment manifest, YAML or JSON, as the operator renders it in
pairing.json: read with the API model, spec.pairing.pair_from_rendered) or `--model PRESET --prefill-tp N
--decode-tp N [...]`, plus `--prompt-tokens` and `--layers`. Engines use P2P handshakes over tcp
(`--local-hostname`, default $POD_IP), as vllm-ascend's PD connectors discover peers.

`serve` opens a Mooncake engine, registers every prefill rank's KV tensors for a test prompt, laid
out with the pairing's real engine block size, fills them with the deterministic prompt content and
publishes its segment name, the tensors' addresses and a fingerprint of the geometry as JSON at
`GET /descriptor`. `check` fetches that, refuses a peer built for another pairing, pulls every
decode rank's runs of the plan through the transfer engine, verifies every byte and prints
`{ok, latencyMs, gbps, bytes, entries, errors}`. A peer's descriptor is checked field by field
(parse_descriptor) before anything uses it: whatever a peer sends, the check fails with an error
naming what is wrong and the gate keeps answering, since a crashed gate container would restart the
whole multi-pod instance (controller/pods.py counts any container's restarts). `gate` checks every
prefill instance of the deployment in `--config` (or the `--peer`s given) every `--every` seconds,
prints one JSON line per round and answers `GET /ready` with 200 while the last round linked every
peer, 503 otherwise (`GET /link` returns the last round). Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import yaml

from pd_operator.kv import presets
from pd_operator.kv.side import ASCEND_KERNEL_BLOCK, Side
from pd_operator.kv.simulate import UNWRITTEN, regions
from pd_operator.names import Names
from pd_operator.proxy.membership import parse_document
from pd_operator.spec.pairing import DEFAULT_CONNECTOR, ManifestError, PairInput, pair_from_rendered
from pd_operator.spec.ports import PROBE_PORT, PROBE_READY_PATH
from pd_operator.transfer import arena
from pd_operator.transfer.engine import Engine, EngineError, open_engine
from pd_operator.transfer.executor import Peer, pull
from pd_operator.transfer.probe_geometry import (
    DEFAULT_LAYERS,
    DEFAULT_PROMPT_TOKENS,
    GeometryError,
    ProbeGeometry,
    fingerprint_differences,
    peer_value,
    probe_geometry,
)
from pd_operator.transfer.ranks import PREFILL_BACKGROUND, differences, write_request

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
DESCRIPTOR_PATH = "/descriptor"


class InputError(Exception):
    """Input the probe cannot use; printed as one line, exit code 2."""


# --- pairing and discovery --------------------------------------------------------------------

def read_manifest(path: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err}") from None
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML or JSON: {str(err).splitlines()[0]}") from None


def pairing(args: argparse.Namespace) -> PairInput:
    if args.config:
        doc = read_manifest(args.config)
        try:
            return pair_from_rendered(doc)
        except ManifestError as err:
            raise InputError(f"{args.config}: {err}") from None
    if not (args.model and args.prefill_tp and args.decode_tp):
        raise InputError("give --config FILE, or --model, --prefill-tp and --decode-tp")
    try:
        model = presets.get(args.model)
    except KeyError as err:
        raise InputError(f"--model: {err.args[0]}") from None

    def side(role: str, tp: int, pp: int, block: int | None) -> Side:
        return Side(role, model, tp, 1, pp, args.kv_cache_dtype, block,  # type: ignore[arg-type]
                    args.kernel_block_size, args.num_speculative_tokens, f"--{role}")

    return PairInput(side("prefill", args.prefill_tp, args.prefill_pp, args.prefill_block_size),
                     side("decode", args.decode_tp, 1, args.decode_block_size), DEFAULT_CONNECTOR)


POSITIVE_FLAGS = ("prefill_tp", "prefill_pp", "decode_tp", "prefill_block_size", "decode_block_size",
                  "kernel_block_size", "prompt_tokens", "layers")


def geometry(args: argparse.Namespace) -> ProbeGeometry:
    for name in POSITIVE_FLAGS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')}: {value} must be at least 1")
    try:
        return probe_geometry(pairing(args), args.prompt_tokens, args.layers)
    except GeometryError as err:
        raise InputError(str(err)) from None


def local_hostname(args: argparse.Namespace) -> str:
    return args.local_hostname or os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())


def engine(args: argparse.Namespace) -> Engine:
    return open_engine(local_hostname(args))


# --- serve -------------------------------------------------------------------------------------

def prefill_arena(geo: ProbeGeometry) -> tuple[np.ndarray, list[dict]]:
    """Every prefill rank's tensors in one arena, filled with the test prompt; the region list."""
    layouts = [list(regions(geo.prefill, rank, *geo.prefill_pool)) for rank in range(geo.prefill_ranks)]
    sizes = [arena.region_offsets(regs)[1] for regs in layouts]
    memory = np.full(sum(sizes), PREFILL_BACKGROUND, dtype=np.uint8)
    published, at = [], 0
    for rank, (regs, size) in enumerate(zip(layouts, sizes, strict=True)):
        views = arena.carve(memory[at: at + size], regs)
        write_request(geo.prefill, rank, views, geo.request.prefill)
        published += [{"rank": rank, "group": g, "component": c, "layer": layer, "address": addr, "bytes": n}
                      for (g, c, layer), (addr, n) in arena.addresses(views).items()]
        at += size
    return memory, published


def descriptor(eng: Engine, memory: np.ndarray, published: list[dict], geo: ProbeGeometry) -> dict:
    return {"segment": eng.segment, "base": int(memory.ctypes.data),
            "bytes": len(memory), "geometry": geo.fingerprint(), "regions": published}


def cmd_serve(args: argparse.Namespace) -> int:
    geo = geometry(args)
    memory, published = prefill_arena(geo)
    try:
        eng = engine(args)
        eng.register(int(memory.ctypes.data), len(memory))
    except EngineError as err:
        print(json.dumps({"ok": False, "errors": [str(err)]}), flush=True)
        return EXIT_FAILED
    body = json.dumps(descriptor(eng, memory, published, geo)).encode()
    server = json_server(args.host, args.port, {DESCRIPTOR_PATH: lambda: (200, body),
                                                "/healthz": lambda: (200, b'{"ok": true}')})
    print(json.dumps({"serving": f"http://{args.host}:{server.server_port}{DESCRIPTOR_PATH}",
                      "segment": eng.segment, "bytes": len(memory)}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK


Route = Callable[[], tuple[int, bytes]]


def json_server(host: str, port: int, routes: dict[str, Route]) -> ThreadingHTTPServer:
    """An HTTP server answering GET on `routes` with (status, JSON body)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, payload = routes.get(self.path, lambda: (404, b'{"error": "not found"}'))()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: Any) -> None:  # readiness probes would flood the log
            pass

    return ThreadingHTTPServer((host, port), Handler)


# --- check -------------------------------------------------------------------------------------

class ProbeFailure(Exception):
    pass


MAX_DESCRIPTOR_BYTES = 64 * 2**20
"""Far above any real descriptor (a region per rank, group, component and probed layer)."""
MAX_NAME = 255
MAX_RANKS = 4096
ADDRESS_SPACE = 2**64


@dataclass(frozen=True)
class Descriptor:
    """A peer's published test buffer, checked: every region lies inside the buffer."""

    segment: str
    base: int
    bytes: int
    geometry: dict
    peers: dict[int, Peer]
    """Per prefill rank: its regions, as the puller reads them."""


def _integer(value: Any, what: str, low: int, high: int) -> int:
    """`value` when it is a JSON integer in [low, high]."""
    if type(value) is not int or not low <= value <= high:
        raise ProbeFailure(f"the peer's descriptor has {what} {peer_value(value)}, not an integer from {low} "
                           f"to {high}")
    return value


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME or not value.isprintable():
        raise ProbeFailure(f"the peer's descriptor has {what} {peer_value(value)}, not a name of 1 to "
                           f"{MAX_NAME} printable characters")
    return value


SEGMENT = re.compile(r"[A-Za-z0-9.\-\[\]:]{1,250}:[0-9]{1,5}")
"""A Mooncake P2P segment name: `host:rpc_port` (transfer/engine.py)."""


def parse_descriptor(raw: bytes) -> Descriptor:
    """The descriptor a peer sent, or ProbeFailure saying what is wrong with it (never another
    exception: the bytes come from the network)."""
    if len(raw) > MAX_DESCRIPTOR_BYTES:
        raise ProbeFailure(f"the peer's descriptor is over {MAX_DESCRIPTOR_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as err:  # bad JSON or UTF-8, digits over the limit, deep nesting
        raise ProbeFailure(f"the peer's descriptor is not JSON: {peer_value(str(err))}") from None
    if not isinstance(doc, dict):
        raise ProbeFailure(f"the peer's descriptor is {peer_value(doc)}, not a JSON object")
    segment = doc.get("segment")
    if not isinstance(segment, str) or not SEGMENT.fullmatch(segment) or \
            not 0 < int(segment.rsplit(":", 1)[1]) < 65536:
        raise ProbeFailure(f"the peer's descriptor has segment {peer_value(segment)}, not host:port")
    base = _integer(doc.get("base"), "base", 0, ADDRESS_SPACE - 1)
    size = _integer(doc.get("bytes"), "bytes", 0, ADDRESS_SPACE - base)
    geometry, regions = doc.get("geometry"), doc.get("regions")
    if not isinstance(geometry, dict):
        raise ProbeFailure(f"the peer's descriptor has geometry {peer_value(geometry)}, not an object")
    if not isinstance(regions, list):
        raise ProbeFailure(f"the peer's descriptor has regions {peer_value(regions)}, not a list")
    by_rank: dict[int, dict] = {}
    for i, region in enumerate(regions):
        where = f"regions[{i}]"
        if not isinstance(region, dict):
            raise ProbeFailure(f"the peer's descriptor has {where} {peer_value(region)}, not an object")
        rank = _integer(region.get("rank"), f"{where}.rank", 0, MAX_RANKS - 1)
        key = (_name(region.get("group"), f"{where}.group"),
               _name(region.get("component"), f"{where}.component"),
               _integer(region.get("layer"), f"{where}.layer", 0, 2**31 - 1))
        address = _integer(region.get("address"), f"{where}.address", base, base + size)
        length = _integer(region.get("bytes"), f"{where}.bytes", 0, base + size - address)
        regs = by_rank.setdefault(rank, {})
        if key in regs:
            raise ProbeFailure(f"the peer's descriptor lists rank {rank}'s region {key} twice")
        regs[key] = (address, length)
    return Descriptor(segment, base, size, geometry,
                      {rank: Peer(rank, segment, regs) for rank, regs in by_rank.items()})


def fetch_descriptor(peer: str, timeout: float) -> Descriptor:
    url = f"http://{peer}{DESCRIPTOR_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            raw = answer.read(MAX_DESCRIPTOR_BYTES + 1)
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
        raise ProbeFailure(f"cannot fetch the descriptor from {url}: {peer_value(str(err))}") from None
    return parse_descriptor(raw)


class Checker:
    """One engine and one decode arena, reused for every check (the gate checks for as long as
    the pod lives)."""

    def __init__(self, geo: ProbeGeometry, eng: Engine) -> None:
        self.geo = geo
        self.eng = eng
        self.memory, self.ranks = decode_arena(geo)
        self.eng.register(int(self.memory.ctypes.data), len(self.memory))

    def check(self, peer: str, timeout: float) -> dict:
        result: dict[str, Any] = {"peer": peer, "ok": False, "latencyMs": None, "gbps": None, "bytes": 0,
                                  "entries": 0, "errors": []}
        geo = self.geo
        try:
            desc = fetch_descriptor(peer, timeout)
            mismatch = fingerprint_differences(geo.fingerprint(), desc.geometry)
            if mismatch:
                raise ProbeFailure("the peer serves another pairing: " + "; ".join(mismatch))
            # P2P handshake discovery must find the peer's segment and its registered buffer.
            if self.eng.first_buffer(desc.segment) != desc.base:
                raise ProbeFailure(f"the handshake with segment {desc.segment} did not return the "
                                   "buffer it published")
        except (ProbeFailure, EngineError) as err:
            result["errors"].append(str(err))
            return result
        self.memory.fill(UNWRITTEN)  # a byte left from an earlier round must not pass as pulled
        peers = desc.peers
        seconds = 0.0
        for rank, (rank_memory, rank_views) in enumerate(self.ranks):
            report = pull(self.eng, geo.request.plan, rank, arena.addresses(rank_views), peers)
            seconds += report.seconds
            result["bytes"] += report.bytes
            result["entries"] += report.entries
            result["errors"] += [str(f) for f in report.failures]
            if report.failed_count > len(report.failures):
                result["errors"].append(f"decode rank {rank}: {report.failed_count - len(report.failures)} "
                                        "more failed runs")
            if report.ok:
                result["errors"] += differences(rank_memory, rank_views, geo.decode, rank, geo.decode_pool,
                                                [geo.request.decode])
        result["latencyMs"] = round(seconds * 1e3, 3)
        result["gbps"] = round(result["bytes"] / seconds / 1e9, 3) if seconds > 0 else 0.0
        result["ok"] = not result["errors"]
        return result


def decode_arena(geo: ProbeGeometry) -> tuple[np.ndarray, list[tuple[np.ndarray, dict]]]:
    """All decode ranks' tensors in one blank arena; each rank's slice of it and views."""
    layouts = [list(regions(geo.decode, rank, *geo.decode_pool)) for rank in range(geo.decode_ranks)]
    sizes = [arena.region_offsets(regs)[1] for regs in layouts]
    memory = np.full(sum(sizes), UNWRITTEN, dtype=np.uint8)
    ranks, at = [], 0
    for regs, size in zip(layouts, sizes, strict=True):
        ranks.append((memory[at: at + size], arena.carve(memory[at: at + size], regs)))
        at += size
    return memory, ranks


def cmd_check(args: argparse.Namespace) -> int:
    geo = geometry(args)
    began = time.monotonic()
    try:
        result = Checker(geo, engine(args)).check(args.peer, args.timeout)
    except EngineError as err:
        result = {"peer": args.peer, "ok": False, "latencyMs": None, "gbps": None, "bytes": 0, "entries": 0,
                  "errors": [str(err)]}
    result["totalMs"] = round((time.monotonic() - began) * 1e3, 3)
    print(json.dumps(result))
    return EXIT_OK if result["ok"] else EXIT_FAILED


# --- gate --------------------------------------------------------------------------------------

def prefill_peers(doc: Any) -> list[str]:
    """The probe endpoint of every prefill instance's leader pod of a PDDeployment manifest."""
    meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    names = Names(meta.get("name", ""), meta.get("namespace") or "default")
    replicas = int((spec.get("prefill") or {}).get("replicas", 1))
    return [f"{names.pod_host('prefill', i, 0)}:{PROBE_PORT}" for i in range(replicas)]


def membership_peers(path: str, layout: str | None = None) -> list[str]:
    """The probe endpoint of every prefill instance the proxy's membership file lists (the hosts
    of its upstream URLs: the instances' leader pods); with `layout`, only those on that KV layout
    (the proxy pairs no others with this decode instance)."""
    try:
        members = parse_document(read_manifest(path))
    except ValueError as err:
        raise InputError(f"{path}: {err}") from None
    return [f"{urlsplit(u.url).hostname}:{PROBE_PORT}" for u in members.prefill
            if layout is None or u.layout == layout]


def gate_round(checker: Checker | None, peers: list[str], timeout: float, error: str | None = None) -> dict:
    """One round: linked only when there is a peer and every peer's check passed."""
    results = [checker.check(peer, timeout) for peer in peers] if checker else []
    errors = [error] if error else [] if peers else ["no prefill instance to link to"]
    return {"ok": bool(results) and all(r["ok"] for r in results), "peers": results, "errors": errors,
            "at": time.time()}


def cmd_gate(args: argparse.Namespace) -> int:
    geo = geometry(args)
    last: dict[str, Any] = {"ok": False, "peers": [], "errors": ["no check has run yet"]}
    lock = threading.Lock()

    def answer(ready_only: bool) -> tuple[int, bytes]:
        with lock:
            body = json.dumps(last).encode()
            return (200 if last["ok"] or not ready_only else 503), body

    routes = {PROBE_READY_PATH: lambda: answer(True), "/link": lambda: answer(False)}
    server = json_server(args.host, args.port, routes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    checker: Checker | None = None
    while True:
        error = None
        if checker is None:
            try:
                checker = Checker(geo, engine(args))
            except EngineError as err:  # stay up and not ready: a restart would restart the group
                error = str(err)
        try:
            peers = args.peer or (membership_peers(args.membership, args.layout) if args.membership
                                  else prefill_peers(read_manifest(args.config)))
        except InputError as err:  # the mounted config is replaced in place; keep the last peers
            peers, error = [], str(err)
        result = gate_round(checker, peers, args.timeout, error)
        with lock:
            last = result
        print(json.dumps(result), flush=True)
        time.sleep(args.every)


# --- command line ------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    pair = common.add_argument_group("pairing")
    pair.add_argument("--config", help="PDDeployment manifest (YAML or JSON) to take the pairing from")
    pair.add_argument("--model", help="built-in model preset (see `pdctl models`)")
    pair.add_argument("--prefill-tp", type=int)
    pair.add_argument("--prefill-pp", type=int, default=1)
    pair.add_argument("--decode-tp", type=int)
    pair.add_argument("--prefill-block-size", type=int)
    pair.add_argument("--decode-block-size", type=int)
    pair.add_argument("--kernel-block-size", type=int, default=ASCEND_KERNEL_BLOCK)
    pair.add_argument("--kv-cache-dtype", default="auto")
    pair.add_argument("--num-speculative-tokens", type=int, default=0)
    pair.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS,
                      help=f"test prompt length (default {DEFAULT_PROMPT_TOKENS}, ends mid-block)")
    pair.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                      help=f"layers per cache group to register (default {DEFAULT_LAYERS})")
    common.add_argument("--local-hostname", help="this engine's IP (default $POD_IP)")

    top = argparse.ArgumentParser(prog="pd-kv-probe", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", parents=[common], help="prefill side: publish a test buffer and stay up")
    serve.add_argument("--host", default="0.0.0.0", help="address of the descriptor endpoint")
    serve.add_argument("--port", type=int, default=PROBE_PORT, help="port of the descriptor endpoint")
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser("check", parents=[common], help="pull and verify once, exit 0/1")
    check.add_argument("--peer", required=True, help="host:port of a `pd-kv-probe serve`")
    check.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the descriptor")
    check.set_defaults(func=cmd_check)
    gate = sub.add_parser("gate", parents=[common], help="decode side: check every prefill periodically, "
                          "answer /ready")
    gate.add_argument("--host", default="0.0.0.0", help="address of the /ready endpoint")
    gate.add_argument("--port", type=int, default=PROBE_PORT, help="port of the /ready endpoint")
    gate.add_argument("--every", type=float, default=30.0, help="seconds between rounds")
    gate.add_argument("--peer", action="append", default=[],
                      help="host:port of a `pd-kv-probe serve` (repeatable); default: every prefill "
                           "instance --membership lists, else every one of --config")
    gate.add_argument("--membership", help="the proxy's membership file (re-read every round): link the "
                                           "prefill instances it routes to")
    gate.add_argument("--layout", help="this pod's kv-layout hash: link only the --membership prefill "
                                       "instances on it")
    gate.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a descriptor")
    gate.set_defaults(func=cmd_gate)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "gate" and not (args.config or args.peer):
        print("pd-kv-probe: gate needs --config (its prefill instances) or --peer", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args))
    except InputError as err:
        print(f"pd-kv-probe: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())

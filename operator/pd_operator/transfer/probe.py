"""`pd-kv-probe`: prove a prefill/decode KV link works before serving traffic (a readiness gate).

    pd-kv-probe serve --port 36900 PAIRING DISCOVERY      (prefill side; stays up)
    pd-kv-probe check --peer HOST:36900 PAIRING DISCOVERY (decode side; exit 0 ok, 1 failed)

PAIRING is `--config FILE` (a PDDeployment manifest, YAML or JSON) or `--model PRESET --prefill-tp N
--decode-tp N [...]`, plus `--prompt-tokens` and `--layers`. DISCOVERY is `--metadata-server`
(P2PHANDSHAKE, http://host:port/metadata, etcd://host:2379), `--local-hostname`, `--protocol`.

`serve` opens a Mooncake engine, registers every prefill rank's KV tensors for a test prompt, laid
out with the pairing's real engine block size, fills them with the deterministic prompt content and
publishes its segment name, the tensors' addresses and a fingerprint of the geometry as JSON at
`GET /descriptor`. `check` fetches that, refuses a peer built for another pairing, pulls every
decode rank's runs of the plan through the transfer engine, verifies every byte and prints
`{ok, latencyMs, gbps, bytes, entries, errors}`. Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pd_operator.kv import presets
from pd_operator.kv.side import ASCEND_KERNEL_BLOCK, Side
from pd_operator.kv.simulate import UNWRITTEN, regions
from pd_operator.localnet import free_port
from pd_operator.manifest import DEFAULT_CONNECTOR, ManifestError, PairInput, pair_from_manifest
from pd_operator.transfer import arena
from pd_operator.transfer.engine import P2P, Engine, EngineError, open_engine
from pd_operator.transfer.executor import Peer, pull
from pd_operator.transfer.probe_geometry import (
    DEFAULT_LAYERS,
    DEFAULT_PROMPT_TOKENS,
    GeometryError,
    ProbeGeometry,
    fingerprint_differences,
    probe_geometry,
)
from pd_operator.transfer.ranks import PREFILL_BACKGROUND, differences, write_request

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
DESCRIPTOR_PATH = "/descriptor"


class InputError(Exception):
    """Input the probe cannot use; printed as one line, exit code 2."""


# --- pairing and discovery --------------------------------------------------------------------

def pairing(args: argparse.Namespace) -> PairInput:
    if args.config:
        try:
            doc = yaml.safe_load(Path(args.config).read_text())
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"{args.config}: cannot read: {err}") from None
        except yaml.YAMLError as err:
            raise InputError(f"{args.config}: not valid YAML or JSON: {str(err).splitlines()[0]}") from None
        try:
            return pair_from_manifest(doc)
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
    """With a metadata server every engine needs a unique `ip:port` name (facts.md section 4)."""
    host = args.local_hostname or os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())
    if args.metadata_server != P2P and ":" not in host:
        host = f"{host}:{free_port()}"
    return host


def engine(args: argparse.Namespace) -> Engine:
    return open_engine(local_hostname(args), args.metadata_server, args.protocol, args.device)


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
    return {"segment": eng.segment, "metadataServer": eng.metadata_server, "base": int(memory.ctypes.data),
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

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == DESCRIPTOR_PATH:
                self._send(200, body)
            elif self.path == "/healthz":
                self._send(200, b'{"ok": true}')
            else:
                self._send(404, b'{"error": "not found"}')

        def _send(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: Any) -> None:  # readiness probes would flood the log
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(json.dumps({"serving": f"http://{args.host}:{server.server_port}{DESCRIPTOR_PATH}",
                      "segment": eng.segment, "bytes": len(memory)}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK


# --- check -------------------------------------------------------------------------------------

def fetch_descriptor(peer: str, timeout: float) -> dict:
    url = f"http://{peer}{DESCRIPTOR_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return dict(json.loads(answer.read()))
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ProbeFailure(f"cannot fetch the descriptor from {url}: {err}") from None


class ProbeFailure(Exception):
    pass


def peers_of(desc: dict) -> dict[int, Peer]:
    by_rank: dict[int, dict] = {}
    for r in desc["regions"]:
        by_rank.setdefault(int(r["rank"]), {})[(r["group"], r["component"], int(r["layer"]))] = \
            (int(r["address"]), int(r["bytes"]))
    return {rank: Peer(rank, desc["segment"], regs) for rank, regs in by_rank.items()}


def run_check(args: argparse.Namespace, geo: ProbeGeometry) -> dict:
    result: dict[str, Any] = {"ok": False, "latencyMs": None, "gbps": None, "bytes": 0, "entries": 0,
                              "errors": []}
    try:
        desc = fetch_descriptor(args.peer, args.timeout)
        mismatch = fingerprint_differences(geo.fingerprint(), desc.get("geometry", {}))
        if mismatch:
            raise ProbeFailure("the peer serves another pairing: " + "; ".join(mismatch))
        eng = engine(args)
        # Metadata discovery must find the peer's segment and its registered buffer.
        if eng.first_buffer(desc["segment"]) != desc["base"]:
            raise ProbeFailure(f"metadata discovery ({args.metadata_server}) did not return the buffer "
                               f"segment {desc['segment']} published")
        memory, ranks = decode_arena(geo)
        eng.register(int(memory.ctypes.data), len(memory))
    except (ProbeFailure, EngineError) as err:
        result["errors"].append(str(err))
        return result
    peers = peers_of(desc)
    seconds = 0.0
    for rank, (rank_memory, rank_views) in enumerate(ranks):
        report = pull(eng, geo.request.plan, rank, arena.addresses(rank_views), peers)
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
    result = run_check(args, geo)
    result["totalMs"] = round((time.monotonic() - began) * 1e3, 3)
    print(json.dumps(result))
    return EXIT_OK if result["ok"] else EXIT_FAILED


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
    disc = common.add_argument_group("discovery")
    disc.add_argument("--metadata-server", default=P2P,
                      help="P2PHANDSHAKE (default), http://host:port/metadata or etcd://host:port")
    disc.add_argument("--local-hostname",
                      help="this engine's name: an IP (default $POD_IP), ip:port with a metadata server")
    disc.add_argument("--protocol", default="tcp", help="tcp (default), rdma or ascend")
    disc.add_argument("--device", default="", help="device name for rdma/ascend")

    top = argparse.ArgumentParser(prog="pd-kv-probe", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", parents=[common], help="prefill side: publish a test buffer and stay up")
    serve.add_argument("--host", default="0.0.0.0", help="address of the descriptor endpoint")
    serve.add_argument("--port", type=int, default=36900, help="port of the descriptor endpoint")
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser("check", parents=[common], help="decode side: pull and verify, exit 0/1")
    check.add_argument("--peer", required=True, help="host:port of a `pd-kv-probe serve`")
    check.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the descriptor")
    check.set_defaults(func=cmd_check)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except InputError as err:
        print(f"pd-kv-probe: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())

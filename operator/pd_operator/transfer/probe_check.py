"""`pd-kv-probe check`, the decode side: fetch a prefill peer's descriptor, check it field by field
(whatever a peer sends, the check fails with an error naming what is wrong), pull every decode rank's
runs of the plan through the transfer engine and verify every byte.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np

from pd_operator.kv.simulate import UNWRITTEN, regions
from pd_operator.transfer import arena
from pd_operator.transfer.engine import Engine, EngineError
from pd_operator.transfer.executor import Peer, pull
from pd_operator.transfer.kv_content import differences
from pd_operator.transfer.probe_geometry import ProbeGeometry, fingerprint_differences, peer_value
from pd_operator.transfer.probe_input import EXIT_FAILED, EXIT_OK, engine, geometry
from pd_operator.transfer.probe_serve import DESCRIPTOR_PATH


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


def region_differences(geo: ProbeGeometry, desc: Descriptor) -> list[str]:
    """Prefill ranks whose published regions are not the ones this side's prefill would have, by
    key and size, as `prefill rank R: ...` (at most one line a rank)."""
    out = []
    for rank in range(geo.prefill_ranks):
        want = geo.prefill_regions(rank)
        peer = desc.peers.get(rank)
        have = {key: length for key, (_, length) in peer.regions.items()} if peer else {}
        if have != want:
            key = next(k for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k))
            out.append(f"prefill rank {rank}: region {key} is {want.get(key)} bytes on this side, "
                       f"the peer {peer_value(have.get(key))}")
    return out


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
            mismatch = (fingerprint_differences(geo.fingerprint(), desc.geometry)
                        or region_differences(geo, desc))
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


def decode_arena(geo: ProbeGeometry, memory: np.ndarray | None = None) -> tuple[np.ndarray,
                                                                              list[tuple[np.ndarray, dict]]]:
    """All decode ranks' tensors in one blank arena; each rank's slice of it and views. The arena is
    `memory` (a uint8 buffer at least that large, e.g. a registered one) when given."""
    layouts = [list(regions(geo.decode, rank, *geo.decode_pool)) for rank in range(geo.decode_ranks)]
    sizes = [arena.region_offsets(regs)[1] for regs in layouts]
    if memory is None:
        memory = np.empty(sum(sizes), dtype=np.uint8)
    elif len(memory) < sum(sizes):
        raise arena.ArenaTooSmall(f"the decode ranks need {sum(sizes)} bytes; the arena has {len(memory)}")
    memory.fill(UNWRITTEN)
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

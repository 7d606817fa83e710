"""`pd-kv-probe serve`, the prefill side: every prefill rank's KV tensors for the test prompt in one
registered arena, filled with the prompt's content, and their addresses published as JSON at
DESCRIPTOR_PATH.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from pd_operator.kv.simulate import regions
from pd_operator.transfer import arena
from pd_operator.transfer.engine import Engine, EngineError
from pd_operator.transfer.kv_content import PREFILL_BACKGROUND, write_request
from pd_operator.transfer.probe_geometry import ProbeGeometry
from pd_operator.transfer.probe_input import EXIT_FAILED, EXIT_OK, engine, geometry

DESCRIPTOR_PATH = "/descriptor"


def prefill_arena(geo: ProbeGeometry, memory: np.ndarray | None = None) -> tuple[np.ndarray, list[dict]]:
    """Every prefill rank's tensors in one arena, filled with the test prompt; the region list. The
    arena is `memory` (a uint8 buffer at least that large, e.g. part of a registered one) when given."""
    layouts = [list(regions(geo.prefill, rank, *geo.prefill_pool)) for rank in range(geo.prefill_ranks)]
    sizes = [arena.region_offsets(regs)[1] for regs in layouts]
    if memory is None:
        memory = np.empty(sum(sizes), dtype=np.uint8)
    elif len(memory) < sum(sizes):
        raise arena.ArenaTooSmall(f"the prefill ranks need {sum(sizes)} bytes; the arena has {len(memory)}")
    memory.fill(PREFILL_BACKGROUND)
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
REQUEST_TIMEOUT_S = 10.0
Post = Callable[[bytes], tuple[int, bytes]]
"""A POST route: the request body (at most its `max_body` bytes) -> (status, JSON body)."""


def json_server(host: str, port: int, routes: dict[str, Route], posts: dict[str, Post] | None = None,
                max_body: int = 0) -> ThreadingHTTPServer:
    """An HTTP server answering GET on `routes` and POST on `posts` with (status, JSON body). A POST
    body over `max_body` bytes, or without a length, is refused unread."""
    post_routes = posts or {}

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # a client that stalls mid-request loses its connection

        def _answer(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._answer(*routes.get(self.path, lambda: (404, b'{"error": "not found"}'))())

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            route = post_routes.get(self.path)
            if route is None:
                return self._answer(404, b'{"error": "not found"}')
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                length = -1
            if not 0 <= length <= max_body:
                return self._answer(413, json.dumps(
                    {"error": f"a body of Content-Length at most {max_body} bytes"}).encode())
            self._answer(*route(self.rfile.read(length)))

        def log_message(self, *_: Any) -> None:  # readiness probes would flood the log
            pass

    return ThreadingHTTPServer((host, port), Handler)

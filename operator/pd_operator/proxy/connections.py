"""pd-proxy's open files: the open-file limit is raised to its hard limit at start and split between
client connections, upstream connections and a reserve (Capacity); client connections are also
held to --max-client-connections. Past its share a new client connection closes the oldest
connection that is between requests (a half-sent one first), or is itself refused (Connections), so
accept() never meets EMFILE. One address holds at most --max-connections-per-source of them: past it
its new connections are refused, so one client cannot take every connection from the others.

These bounds come before the key is checked, with the header limits (HEADER_LIMITS): together they
bound what unauthenticated clients can make the proxy hold (issue 34: 550 connections each holding
about 1 MB of unfinished headers within aiohttp's own limits took it past its memory limit).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from pd_operator.api.types import ProxyLimits
from pd_operator.proxy.answers import RETRY_AFTER_S

log = logging.getLogger("pd_operator.proxy")

HEADER_LIMITS: dict[str, Any] = {"max_line_size": 4096, "max_field_size": 4096, "max_headers": 32}
"""What one request's head may hold before it is answered 400 and closed, well below aiohttp's
defaults (8190, 8190, 128: about 1 MB a connection): 32 lines of 4 KiB, about 136 KiB (aiohttp
3.14: aiohttp/web_protocol.py RequestHandler). An OpenAI client sends about ten short headers; a
bearer token or a W3C trace context fits in a line many times over."""
FD_RESERVE = 64
"""Open files kept for everything but connections: listening sockets, the log, the event loop,
membership reads, admin connections."""
ADMIN_CONNECTIONS = 16


@dataclass(frozen=True)
class Capacity:
    """How the open-file limit is shared: requests at once (each holds a client connection and one
    upstream connection), upstream connections, client connections (the requests', and as many again
    between requests or half-sent)."""

    requests: int
    upstream: int
    clients: int
    open_files: int

    @classmethod
    def of(cls, limits: ProxyLimits, open_files: int) -> Capacity:
        usable = max(open_files - FD_RESERVE, 4)
        requests = max(1, min(limits.max_concurrent_requests, usable // 3))
        return cls(requests, requests, min(limits.max_client_connections, usable - requests), open_files)


def raise_open_file_limit() -> int:
    """The soft open-file limit, raised to the hard limit first where it can be."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _now_and_then(count: int) -> bool:
    """Log the 1st, 10th, 100th and every 1000th of something that repeats under attack."""
    return count in (1, 10, 100) or count % 1000 == 0


class Connections:
    """A protocol factory for one aiohttp server holding at most `cap` connections, at most
    `per_source` of them from one address: a new connection from an address at its share is
    answered 503 and closed; past `cap` a new connection closes the oldest one that is between
    requests (`busy` holds those inside one), or when every one is inside a request is itself
    answered 503 and closed."""

    REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: " + RETRY_AFTER_S.encode()
               + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def __init__(self, server: web.Server, cap: int, busy: set[RequestHandler], name: str,
                 per_source: int | None = None) -> None:
        self.server, self.cap, self.busy, self.name = server, cap, busy, name
        self.per_source = per_source or cap
        self.by_source: dict[str, list[RequestHandler]] = {}
        self.evicted = self.refused = self.over_share = 0

    def __call__(self) -> asyncio.Protocol:
        return _Admit(self)

    def admit(self, source: str) -> RequestHandler | None:
        """The handler for a new connection from `source`, or None when it is refused."""
        held = [h for h in self.by_source.get(source, ()) if h.transport is not None]
        if len(held) >= self.per_source:
            self.over_share += 1
            if _now_and_then(self.over_share):
                log.warning("%s port: %s holds %d connections, its share; refused %d new ones",
                            self.name, source, len(held), self.over_share)
            return None
        live = [h for h in self.server.connections if h.transport is not None]
        if len(live) >= self.cap:
            idle = next((h for h in live if h not in self.busy), None)
            if idle is None:
                self.refused += 1
                if _now_and_then(self.refused):
                    log.warning("%s port: %d connections are all inside requests; refused %d new ones",
                                self.name, len(live), self.refused)
                return None
            self.evicted += 1
            if _now_and_then(self.evicted):
                log.warning("%s port: at its %d connections; closed %d between requests for new ones",
                            self.name, self.cap, self.evicted)
            idle.force_close()
        handler = self.server()
        held.append(handler)
        self.by_source[source] = held
        if len(self.by_source) > 2 * self.cap:  # forget addresses whose connections all closed
            self.by_source = {s: hs for s, hs in self.by_source.items()
                              if any(h.transport is not None for h in hs)}
        return handler


class _Admit(asyncio.Protocol):
    """A new connection until its address is known: then handed to aiohttp's handler, or refused."""

    def __init__(self, connections: Connections) -> None:
        self.connections = connections

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = transport.get_extra_info("peername")
        handler = self.connections.admit(str(peer[0]) if peer else "")
        if handler is None:
            transport.write(Connections.REFUSAL)
            transport.close()
            return
        transport.set_protocol(handler)
        handler.connection_made(transport)

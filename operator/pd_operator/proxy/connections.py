"""pd-proxy's open files: the open-file limit is raised to its hard limit at start and split between
client connections, upstream connections and a reserve (Capacity); past its share a new client
connection closes the oldest connection that is between requests (a half-sent one first), or is
itself refused (Connections), so accept() never meets EMFILE.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from pd_operator.api.types import ProxyLimits
from pd_operator.proxy.answers import RETRY_AFTER_S

log = logging.getLogger("pd_operator.proxy")

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
        return cls(requests, requests, usable - requests, open_files)


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


class Connections:
    """A protocol factory for one aiohttp server holding at most `cap` connections: past it a new
    connection closes the oldest one that is between requests (`busy` holds those inside one), or
    when every one is inside a request is itself answered 503 and closed."""

    REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: " + RETRY_AFTER_S.encode()
               + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def __init__(self, server: web.Server, cap: int, busy: set[RequestHandler], name: str) -> None:
        self.server, self.cap, self.busy, self.name = server, cap, busy, name
        self.evicted = self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        live = [h for h in self.server.connections if h.transport is not None]
        if len(live) >= self.cap:
            idle = next((h for h in live if h not in self.busy), None)
            if idle is None:
                self.refused += 1
                if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
                    log.warning("%s port: %d connections are all inside requests; refused %d new ones",
                                self.name, len(live), self.refused)
                return _Refuse(self.REFUSAL)
            self.evicted += 1
            if self.evicted in (1, 10, 100) or self.evicted % 1000 == 0:
                log.warning("%s port: at its %d connections; closed %d between requests for new ones",
                            self.name, self.cap, self.evicted)
            idle.force_close()
        return self.server()


class _Refuse(asyncio.Protocol):
    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.answer)
        transport.close()

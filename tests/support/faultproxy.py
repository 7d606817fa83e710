"""An HTTPS reverse proxy in front of kube-apiserver that injects faults on chosen requests.

Point a client (the operator) at `proxy.url` with `proxy.kubeconfig(path, token)`; the proxy
passes the bearer token through, so the API server (and its audit log) sees the client's own
user. Responses, watches included, stream through unchanged (no re-encoding, gzip passed as is).

    with FaultProxy(cp) as proxy:
        proxy.inject(verb="patch", resource="statefulsets", status=409, times=2)  # next 2 SSA → 409
        proxy.inject(verb="list", resource="pddeployments", status=410)           # relist path
        proxy.inject(verb="watch", status=410)          # a watch answers an ERROR event with 410
        proxy.inject(resource="services", drop=True)    # connection closed, nothing forwarded
        proxy.inject(verb="patch", delay=2.0, times=None)   # every patch 2 s late
        proxy.inject(verb="create", status=500, after_forward=True)  # applied, yet answered 500
        proxy.inject(status=503, probability=0.1, times=None, seed=1)  # 10% of everything
        proxy.on_write(5, lambda w: operator.kill())    # SIGKILL right after the 5th write lands
        proxy.cut_watches()                             # reset every open watch connection
        proxy.writes                                    # forwarded writes: verb, resource, status

A rule matches on `verb` (get, list, watch, create, update, patch, delete, deletecollection),
`resource` (plural, `pods/status` for a subresource), `namespace` and `name`, each optional.
`skip` lets that many matches through first; `times` (None: forever) bounds the faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pathlib
import random
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from support.cluster import HOST, ControlPlane, pick_port

log = logging.getLogger(__name__)

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length"})
REASONS = {409: "Conflict", 410: "Expired", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable", 504: "Timeout"}


@dataclass
class Request:
    """What the proxy saw: the Kubernetes verb and resource of one HTTP request."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    group: str
    resource: str
    namespace: str
    name: str
    status: int = 0
    """The status the client got (0: connection dropped)."""
    fault: str = ""

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS

    def __str__(self) -> str:
        where = "/".join(p for p in (self.namespace, self.name) if p)
        fault = f" ({self.fault})" if self.fault else ""
        return f"{self.verb} {self.group}/{self.resource} {where} -> {self.status}{fault}"


def describe(method: str, path: str, query: dict[str, str]) -> Request:
    """Map an API path to verb/group/resource/namespace/name as the API server's RequestInfo does."""
    parts = [p for p in path.split("/") if p]
    group, rest = "", []
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    watch = query.get("watch") in ("1", "true")
    if rest[:1] == ["watch"]:  # the deprecated /watch/ prefix
        watch, rest = True, rest[1:]
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    resource = f"{plural}/{rest[2]}" if len(rest) > 2 else plural
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
    if method == "GET":
        verb = "watch" if watch else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    return Request(method, path, query, verb, group, resource, namespace, name)


@dataclass
class Rule:
    verb: str | None = None
    resource: str | None = None
    namespace: str | None = None
    name: str | None = None
    status: int | None = None
    drop: bool = False
    delay: float = 0.0
    after_forward: bool = False
    times: int | None = 1
    skip: int = 0
    probability: float = 1.0
    rng: random.Random = field(default_factory=random.Random)
    seen: int = 0
    hits: int = 0
    """How many requests this rule has faulted."""

    def matches(self, r: Request) -> bool:
        pairs = ((self.verb, r.verb), (self.resource, r.resource), (self.namespace, r.namespace),
                 (self.name, r.name))
        return all(want is None or want == got for want, got in pairs)

    def fires(self, r: Request) -> bool:
        """Counts a matching request; true when this one gets the fault."""
        if not self.matches(r) or (self.times is not None and self.hits >= self.times):
            return False
        self.seen += 1
        if self.seen <= self.skip or self.rng.random() >= self.probability:
            return False
        self.hits += 1
        return True


@dataclass
class WriteHook:
    n: int
    hook: Callable[[Request], Any]
    verb: str | None
    resource: str | None
    namespace: str | None
    count: int = 0
    fired: threading.Event = field(default_factory=threading.Event)


def _status_body(code: int, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": REASONS.get(code, "InternalError"),
                       "code": code}).encode()


class FaultProxy:
    def __init__(self, control_plane: ControlPlane) -> None:
        self.cp = control_plane
        self.port = 0
        self.url = ""
        self.requests: list[Request] = []
        self.rules: list[Rule] = []
        self._hooks: list[WriteHook] = []
        self._lock = threading.Lock()
        self._watches: dict[asyncio.Task[Any], Request] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- what tests use ---------------------------------------------------------------------

    def inject(self, verb: str | None = None, resource: str | None = None, *, namespace: str | None = None,
               name: str | None = None, status: int | None = None, drop: bool = False, delay: float = 0.0,
               after_forward: bool = False, times: int | None = 1, skip: int = 0, probability: float = 1.0,
               seed: int | None = None) -> Rule:
        if status is None and not drop and not delay:
            raise ValueError("a fault needs status=, drop=True or delay=")
        rule = Rule(verb, resource, namespace, name, status, drop, delay, after_forward, times, skip,
                    probability, random.Random(seed))
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule and write hook."""
        with self._lock:
            self.rules.clear()
            self._hooks.clear()

    def on_write(self, n: int, hook: Callable[[Request], Any], *, verb: str | None = None,
                 resource: str | None = None, namespace: str | None = None) -> threading.Event:
        """Call `hook(request)` once, when the `n`th forwarded write (matching verb/resource/namespace,
        counted from now) has been applied by the API server and before its response reaches the
        client. Returns an Event set after the hook ran. Give `namespace` when the client serves all
        namespaces: earlier tests' namespaces may still be terminating in the session's cluster."""
        entry = WriteHook(n, hook, verb, resource, namespace)
        with self._lock:
            self._hooks.append(entry)
        return entry.fired

    @property
    def writes(self) -> list[Request]:
        """Writes the API server answered (faulted-before-forwarding ones are not writes)."""
        with self._lock:
            return [r for r in self.requests if r.write and r.fault in ("", "after_forward", "delay")]

    def cut_watches(self) -> int:
        """Reset every watch streaming through now; returns how many."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)

    def open_watches(self, namespace: str | None = None) -> int:
        """How many watches (in `namespace`, or anywhere) stream through now: a test waits for one
        before it cuts, since a client re-lists and re-watches after each cut."""
        with self._lock:
            return sum(1 for r in self._watches.values() if namespace in (None, r.namespace))

    def kubeconfig(self, path: pathlib.Path, token: str, user: str = "user") -> pathlib.Path:
        """A kubeconfig for `token` that reaches the API server through this proxy."""
        return self.cp.write_kubeconfig(path, token, server=self.url, user=user)

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FaultProxy:
        started = threading.Event()
        errors: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._start())
            except BaseException as err:  # reported to start()'s caller
                errors.append(err)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=serve, name="fault-proxy", daemon=True)
        self._thread.start()
        started.wait()
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop and self._thread:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=15)

    async def _start(self) -> None:
        serving = self.cp.ca.serving(f"proxy-{id(self)}", [HOST, "localhost"]) if self.cp.ca else None
        assert serving is not None, "start the control plane first"
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(serving.cert, serving.key)
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            connector=aiohttp.TCPConnector(ssl=self.cp.ssl_context, limit=0))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        for attempt in range(5):
            self.port = pick_port()
            try:
                await web.TCPSite(self._runner, HOST, self.port, ssl_context=server_ssl).start()
                break
            except OSError:
                if attempt == 4:
                    raise
        self.url = f"https://{HOST}:{self.port}"

    async def _shutdown(self) -> None:
        await self._cut()
        if self._runner:
            await self._runner.cleanup()
        if self._session:
            await self._session.close()

    async def _cut(self) -> int:
        with self._lock:
            tasks = list(self._watches)
        for task in tasks:
            task.cancel()
        return len(tasks)

    # -- the proxy --------------------------------------------------------------------------

    def _fault_for(self, r: Request) -> Rule | None:
        with self._lock:
            self.requests.append(r)
            for rule in self.rules:
                if rule.fires(r):
                    return rule
        return None

    def _after_write(self, r: Request) -> None:
        with self._lock:
            due = []
            for entry in self._hooks:
                wanted = ((entry.verb, r.verb), (entry.resource, r.resource), (entry.namespace, r.namespace))
                if entry.fired.is_set() or any(want and want != got for want, got in wanted):
                    continue
                entry.count += 1
                if entry.count == entry.n:
                    due.append(entry)
        for entry in due:
            try:
                entry.hook(r)
            except Exception:
                log.exception("write hook failed")
            entry.fired.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        info = describe(request.method, request.path, dict(request.query))
        # A created object's name is in its body: JSON from the operator's client (client-go and
        # kubectl's typed commands may send protobuf; then the name stays empty).
        if info.verb == "create" and not info.name:
            with contextlib.suppress(ValueError, AttributeError):
                info.name = str(json.loads(body)["metadata"].get("name") or "")
        rule = self._fault_for(info)
        if rule and rule.delay:
            info.fault = "delay"
            await asyncio.sleep(rule.delay)
        if rule and rule.drop:
            info.fault = "drop"
            if request.transport:
                request.transport.abort()
            raise asyncio.CancelledError  # aiohttp drops the handler without answering
        if rule and rule.status and not rule.after_forward:
            info.fault, info.status = f"status {rule.status}", rule.status
            return self._refusal(info, rule.status)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = f"{self.cp.server}{request.path_qs}"
        assert self._session is not None
        async with self._session.request(request.method, url, data=body or None, headers=headers,
                                         allow_redirects=False) as upstream:
            if info.write and upstream.status < 400:
                self._after_write(info)
            if rule and rule.status and rule.after_forward:
                info.fault, info.status = "after_forward", rule.status
                return self._refusal(info, rule.status)
            info.status = upstream.status
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            await response.prepare(request)
            if info.verb == "watch":
                task = asyncio.current_task()
                assert task is not None
                with self._lock:
                    self._watches[task] = info
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except asyncio.CancelledError:
                if request.transport:
                    request.transport.abort()
                raise
            finally:
                with self._lock:
                    self._watches.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
            return response

    def _refusal(self, info: Request, code: int) -> web.Response:
        message = f"injected by the test fault proxy: {info.verb} {info.resource}"
        if info.verb == "watch" and code == 410:
            # The API server answers a watch from a compacted resourceVersion with 200 and an ERROR
            # event carrying the 410 Status (k8s.io/apiserver: pkg/endpoints/handlers/watch.go).
            status = json.loads(_status_body(410, f"too old resource version; {message}"))
            event = {"type": "ERROR", "object": status}
            return web.Response(status=200, body=json.dumps(event).encode() + b"\n",
                                content_type="application/json")
        return web.Response(status=code, body=_status_body(code, message), content_type="application/json")

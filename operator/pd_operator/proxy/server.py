"""The pd-proxy process: an aiohttp server routing each request to a prefill member, then to a
decode member, by the membership file it re-reads while it runs.

Its parts: the two ports, the membership and the answers that do not route a completion here;
how a completion is routed, with its accounting, retries and timeouts, in routing.py; error answers
in answers.py; the bounds on bodies in bodies.py, on open files and connections in connections.py.

Membership: with API access (a ServiceAccount token, --membership-configmap), the proxy watches its
ConfigMap (proxy/watch.py) and applies each change as the API server sends it. The mounted file is
the fallback: it is polled (content, not mtime: the kubelet replaces a projected ConfigMap by
swapping a symlink) and applied when there is no watch (no API access) or the watch never got
through, and when a watch that had applied the ConfigMap has been down longer than the file can lag
(watch.FILE_LAG_S); never sooner, since the kubelet's projection lags the API and an older version
could route to an instance that has left. A missing or malformed membership keeps the last good
one. New requests go only to current members; a request already in flight to an instance that left
finishes there.

Bounds (api/types.py ProxyLimits, the options in options.py): it faces clients, so nothing a client
sends or withholds grows it without limit. A connection that has not sent a request's headers within
--header-timeout is closed (aiohttp's keep-alive timer runs from the connection's start and closes
it while no whole request has arrived); request bodies and open files are bounded as bodies.py and
connections.py say. Requests past --max-concurrent-requests are answered 503 with Retry-After, never
queued.

Separation: the clients' port serves only the OpenAI paths and /healthcheck (the readiness probe);
/pd/state and /reset_prefix_cache are on --admin-port, which the Service does not expose and the
NetworkPolicy admits only from the operator's namespace (render/policy.py) and which, given an admin
token (options.ADMIN_TOKEN_ENV, derived by the operator: render/policy.py admin_token), wants it on
every path; /metrics is on --metrics-port (proxy/metrics.py), which the NetworkPolicy admits from the
metrics scrapers. With an API key (the env options.API_KEY_ENV, from the Secret spec.proxy.apiKey
names) every other path of the clients' port wants `Authorization: Bearer <key>` (compared in
constant time), and the engines get the same key. Error answers name roles and instance names
(`glm-flash-decode-1`), never upstream URLs or DNS names; the log has the detail. aiohttp's access
log is off, and its error log says what went wrong and from where, never what the client sent (a
malformed request's exception text holds its raw bytes, the key included).

Membership entries: started with its deployment's name, namespace and serving port (--deployment,
--namespace, --serving-port, as the operator renders it), the proxy accepts a membership only when
every entry is one of that deployment's instances at the address the operator renders for it
(membership.InstanceAddresses): whoever can write the ConfigMap cannot send the prompts, or the
engines' key, anywhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import logging
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CONTENT_TYPE_LATEST

from pd_operator.api.types import ROLES, ProxyLimits
from pd_operator.names import Names
from pd_operator.proxy import options
from pd_operator.proxy.answers import UPSTREAM_ERRORS, BadRequest, busy, error, forwarded, invalid, why
from pd_operator.proxy.balancer import Balancer
from pd_operator.proxy.bodies import Bodies
from pd_operator.proxy.connections import (
    ADMIN_CONNECTIONS,
    HEADER_LIMITS,
    Capacity,
    Connections,
    raise_open_file_limit,
)
from pd_operator.proxy.kv_events import Subscriptions
from pd_operator.proxy.membership import (
    KEY,
    MOUNT_DIR,
    STATE_PATH,
    InstanceAddresses,
    parse_text,
    state_document,
)
from pd_operator.proxy.metrics import METRICS_PATH, ProxyMetrics
from pd_operator.proxy.prefix_routing import DEFAULT_MODE, MODES, Mode
from pd_operator.proxy.routing import Router, engine_headers
from pd_operator.proxy.watch import SERVICE_ACCOUNT_DIR, ConfigMapWatch, configmap_watch

log = logging.getLogger("pd_operator.proxy")

HEALTH_PATH = "/healthcheck"
RESET_PATH = "/reset_prefix_cache"
COMPLETIONS = ("/v1/completions", "/v1/chat/completions")
MODELS_PATH = "/v1/models"
ARRIVED = "pd_proxy_arrived"
"""The request's key for when its head arrived (time.monotonic): its latencies start there."""
MODELS_TIMEOUT_S = 5.0
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""An X-Request-Id the proxy passes on: it goes into engine headers, bodies and KV parameters."""
_UNREAD = object()


class Proxy:
    def __init__(self, membership: Path, limits: ProxyLimits | None = None, *, retry_delay: float = 0.2,
                 poll_interval: float = 1.0, connect_timeout: float = 10.0, open_files: int = 1 << 20,
                 api_key: str | None = None, addresses: InstanceAddresses | None = None,
                 admin_token: str | None = None, prefix_routing: Mode = DEFAULT_MODE) -> None:
        self.path = membership
        self.addresses = addresses
        """The only upstreams a membership may name (None: any)."""
        self.limits = limits or ProxyLimits()
        self.capacity = Capacity.of(self.limits, open_files)
        self.poll_interval = poll_interval
        self.connect_timeout = connect_timeout
        self.api_key = api_key or None
        self._key_digest = _digest(api_key)
        self._admin_digest = _digest(admin_token)
        self.balancer = Balancer(prefix=prefix_routing)
        self.events = Subscriptions()
        """precise prefix routing: the subscriptions to the prefill members' KV events."""
        self.metrics = ProxyMetrics(self.balancer.state, lambda: self.balancer.prefix)
        self.router = Router(self.balancer, self.limits, lambda: self.session, retry_delay=retry_delay,
                             connect_timeout=connect_timeout, api_key=self.api_key, metrics=self.metrics)
        self.active = 0
        self.bodies = Bodies(self.limits)
        self.busy: set[RequestHandler] = set()
        """The client connections inside a request (the others may be closed for new ones)."""
        self._seen: bytes | None | object = _UNREAD
        self._session: aiohttp.ClientSession | None = None
        self.watch: ConfigMapWatch | None = None
        """The membership watch (None: the file only)."""

    # --- membership ---------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the membership file; apply it when it counts (ConfigMapWatch.file_counts) and its
        content is not the one applied from it last."""
        if self.watch is not None and not self.watch.file_counts():
            self._seen = _UNREAD  # when it counts again, its content then is applied once
            return
        try:
            data: bytes | None = self.path.read_bytes()
            why = ""
        except FileNotFoundError:
            data, why = None, "is missing"
        except OSError as err:
            data, why = None, f"cannot be read ({err.strerror or err})"
        if data == self._seen:
            return
        self._seen = data
        self.apply(data, f"membership file {self.path}", why)

    def apply(self, data: bytes | None, source: str, why: str = "") -> None:
        """Route by the membership document `data` from `source` when it is good (None: `source`
        `why` has none)."""
        keeping = (f"keeping version {self.balancer.version}" if self.balancer.version
                   else "no upstreams until it is good")
        if data is None:
            log.warning("%s %s; %s", source, why, keeping)
            return
        try:
            membership = parse_text(data, self.addresses)
        except ValueError as err:
            log.warning("%s is malformed: %s; %s", source, err, keeping)
            return
        if membership.version != self.balancer.version:
            log.info("membership version %s -> %s from %s: prefill %s, decode %s", self.balancer.version,
                     membership.version, source, [u.name for u in membership.prefill],
                     [u.name for u in membership.decode])
        self.balancer.update(membership)
        self._follow_events()

    def _follow_events(self) -> None:
        """precise prefix routing: subscribe to the KV events of the members' publishers (once the app
        runs: the first reload comes from its lifetime)."""
        if self.balancer.prefix.mode != "precise":
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self.events.follow(self.balancer.prefix.feeds)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            self.reload()

    # --- the apps -----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        """The clients' port."""
        app = web.Application(client_max_size=self.limits.max_body_bytes, middlewares=[self._guard])
        for path in COMPLETIONS:
            app.router.add_post(path, self._completions_of(path))
        app.router.add_get(MODELS_PATH, self.models)
        app.router.add_get(HEALTH_PATH, self.healthcheck)
        app.cleanup_ctx.append(self._lifetime)
        return app

    def admin_app(self) -> web.Application:
        """The admin port: what the operator reads, and what acts on every engine; with an admin
        token (options.ADMIN_TOKEN_ENV) every path wants it."""
        app = web.Application(client_max_size=4096, middlewares=[self._admin_guard])
        app.router.add_get(STATE_PATH, self.state)
        app.router.add_post(RESET_PATH, self.reset_prefix_cache)
        app.router.add_get(HEALTH_PATH, self.healthcheck)
        return app

    def metrics_app(self) -> web.Application:
        """The metrics port: Prometheus text, no key (proxy/metrics.py)."""
        app = web.Application(client_max_size=4096)
        app.router.add_get(METRICS_PATH, self.scrape)
        return app

    async def _lifetime(self, app: web.Application) -> AsyncIterator[None]:
        self.reload()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout)
        # No DNS cache (aiohttp's keeps names 10 s): a replaced engine pod (a rollout, a group restart)
        # has a new IP under its old name, and its old IP may already be another pod's.
        connector = aiohttp.TCPConnector(limit=self.capacity.upstream, use_dns_cache=False)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        watcher = asyncio.create_task(self._watch())
        api_watch = self.watch and asyncio.create_task(self.watch.run())
        yield
        self.events.close()
        watcher.cancel()
        if api_watch:
            api_watch.cancel()
        await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "used before the app started"
        return self._session

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        """Every request of the clients' port: marked inside a request (its connection is not closed
        for a new one), the key checked, counted against the concurrency cap and in the metrics."""
        self.busy.add(request.protocol)
        if request.path == HEALTH_PATH:
            try:
                return await handler(request)
            finally:
                self.busy.discard(request.protocol)
        request[ARRIVED] = time.monotonic()
        status, retry_after = 500, False
        try:
            answer = await self._admitted(request, handler)
            status, retry_after = answer.status, "Retry-After" in answer.headers
            return answer
        except web.HTTPException as err:  # the router's 404 and 405
            status = err.status
            raise
        finally:
            self.busy.discard(request.protocol)
            path = request.path if request.path in (*COMPLETIONS, MODELS_PATH) else "other"
            self.metrics.answered(path, status, retry_after, request[ARRIVED], path in COMPLETIONS)

    async def _admitted(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self.api_key and not self._authorized(request):
            return error(401, "a valid API key is required (Authorization: Bearer <key>)",
                         "authentication_error", {"WWW-Authenticate": "Bearer"})
        if self.active >= self.capacity.requests:
            return busy(f"the proxy serves {self.capacity.requests} requests at once; retry later")
        self.active += 1
        try:
            return await handler(request)
        finally:
            self.active -= 1

    def _authorized(self, request: web.Request) -> bool:
        return _bearer(request, self._key_digest)

    @web.middleware
    async def _admin_guard(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self._admin_digest and not _bearer(request, self._admin_digest):
            return error(401, "the admin token is required (Authorization: Bearer <token>)",
                         "authentication_error", {"WWW-Authenticate": "Bearer"})
        return await handler(request)

    # --- completions --------------------------------------------------------------------------------

    def _completions_of(self, path: str) -> Callable:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.completions(request, path)
        return handler

    async def completions(self, request: web.Request, path: str) -> web.StreamResponse:
        client_id = request.headers.get("X-Request-Id")
        if client_id is not None and not REQUEST_ID.fullmatch(client_id):
            return invalid(400, "X-Request-Id must be 1 to 128 of A-Z a-z 0-9 . _ : -")
        try:
            body, reserved = await self.bodies.read(request)
        except BadRequest as bad:
            return bad.answer
        try:
            return await self.router.route(request, path, body, client_id, request[ARRIVED])
        finally:
            self.bodies.release(reserved)

    # --- the rest of the API ------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        """The first member's /v1/models (prefill members first, as the example proxy asks)."""
        failures = []
        headers = engine_headers(str(uuid.uuid4()), self.api_key)
        for role in ROLES:
            for upstream in self.balancer.members(role):
                try:
                    timeout = aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)
                    async with self.session.get(upstream.url + "/v1/models", headers=headers,
                                                timeout=timeout) as resp:
                        data = await resp.read()
                        if resp.status < 400:
                            return forwarded(resp.status, data, resp.headers.get("Content-Type"))
                        failures.append(f"{upstream.name}: HTTP {resp.status}")
                except UPSTREAM_ERRORS as err:
                    log.warning("/v1/models from %s failed: %s", upstream.name, why(err))
                    failures.append(f"{upstream.name}: {type(err).__name__}")
        return error(503, f"no instance answered /v1/models ({'; '.join(failures) or 'no members'})",
                     "no_upstream")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        failures = []
        for role in ROLES:
            for upstream in self.balancer.listed(role):
                try:
                    timeout = aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)
                    async with self.session.post(upstream.url + RESET_PATH, params=dict(request.query),
                                                 headers=engine_headers(str(uuid.uuid4()), self.api_key),
                                                 timeout=timeout) as resp:
                        if resp.status >= 400:
                            failures.append(f"{upstream.name}: HTTP {resp.status}")
                        elif role == "prefill":
                            self.balancer.prefix.forget(upstream)
                except UPSTREAM_ERRORS as err:
                    log.warning("%s on %s failed: %s", RESET_PATH, upstream.name, why(err))
                    failures.append(f"{upstream.name}: {type(err).__name__}")
        return web.json_response({"failed": failures}, status=500) if failures else web.Response()

    async def healthcheck(self, request: web.Request) -> web.Response:
        """200 only with at least one prefill and one decode member of one KV layout (the readiness
        probe)."""
        counts = {role: len(self.balancer.members(role)) for role in ROLES}
        ok = all(counts.values())
        return web.json_response({"status": "ok" if ok else "no upstreams", "version": self.balancer.version,
                                  "prefill_instances": counts["prefill"],
                                  "decode_instances": counts["decode"], "request_num": self.active},
                                 status=200 if ok else 503)

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response(state_document(self.balancer.state()))

    async def scrape(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def serve(proxy: Proxy, host: str, port: int, admin_port: int, metrics_port: int) -> None:
    """The three ports until SIGTERM or SIGINT. The header timeout is aiohttp's keep-alive timeout: its
    timer starts with the connection and closes it while no whole request has arrived."""
    header = proxy.limits.header_timeout_seconds
    runners = [web.AppRunner(app, handler_cancellation=True, access_log=None, keepalive_timeout=header,
                             **HEADER_LIMITS)
               for app in (proxy.app(), proxy.admin_app(), proxy.metrics_app())]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    servers: list[asyncio.Server] = []
    try:
        for runner in runners:
            await runner.setup()
        (clients, admin, metrics), capacity = [r.server for r in runners], proxy.capacity
        assert clients is not None and admin is not None and metrics is not None, "set up above"
        servers.append(await loop.create_server(
            Connections(clients, capacity.clients, proxy.busy, "clients",
                        proxy.limits.max_connections_per_source), host, port))
        servers.append(await loop.create_server(
            Connections(admin, ADMIN_CONNECTIONS, set(), "admin"), host, admin_port))
        servers.append(await loop.create_server(
            Connections(metrics, ADMIN_CONNECTIONS, set(), "metrics"), host, metrics_port))
        log.info("serving clients on %s:%d, admin on %s:%d, metrics on %s:%d; open files %d: %d requests "
                 "at once, %d client and %d upstream connections", host, port, host, admin_port, host,
                 metrics_port, capacity.open_files, capacity.requests, capacity.clients, capacity.upstream)
        if capacity.clients < proxy.limits.max_client_connections:
            log.warning("the open-file limit (%d) holds %d client connections, not maxClientConnections %d",
                        capacity.open_files, capacity.clients, proxy.limits.max_client_connections)
        if capacity.requests < proxy.limits.max_concurrent_requests:
            log.warning("the open-file limit (%d) holds %d requests at once, not maxConcurrentRequests %d",
                        capacity.open_files, capacity.requests, proxy.limits.max_concurrent_requests)
        await stop.wait()
    finally:
        for server in servers:
            server.close()
        for runner in reversed(runners):
            await runner.cleanup()


def _digest(secret: str | None) -> bytes:
    return hashlib.sha256(secret.encode()).digest() if secret else b""


def _bearer(request: web.Request, digest: bytes) -> bool:
    """Whether the request carries `Authorization: Bearer <secret>` for the secret of `digest`
    (compared in constant time)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    given = hashlib.sha256(token.strip().encode()).digest()
    return hmac.compare_digest(given, digest) and scheme.lower() == "bearer"


class WithoutRequestData(logging.Filter):
    """aiohttp's error log without what clients sent: the exception of a malformed request carries
    its raw bytes (headers, the API key, body) in its text, and a traceback may show them too. A
    record keeps its message (what failed, from which address) with the exception's class and where
    it was raised, and is a warning: a client's bad request is not the proxy's error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            err, tb = record.exc_info[1], record.exc_info[2]
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
            record.msg, record.args = f"{record.getMessage()}: {type(err).__name__}{where}", ()
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pd-proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--membership", type=Path, default=Path(MOUNT_DIR) / KEY,
                   help="the membership file (pd_operator.proxy.membership.document), re-read while running")
    p.add_argument("--membership-configmap", metavar="NAME",
                   help="watch the membership in this ConfigMap of the pod's namespace through the API "
                        "(with the pod's ServiceAccount), the file being the fallback")
    p.add_argument("--service-account-dir", type=Path, default=SERVICE_ACCOUNT_DIR,
                   help="where the ServiceAccount token, ca.crt and namespace are mounted")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000, help="the clients' port")
    p.add_argument("--admin-port", type=int, default=8001, help=f"the port of {STATE_PATH} and {RESET_PATH}")
    p.add_argument("--metrics-port", type=int, default=8002, help=f"the port of {METRICS_PATH}")
    who = p.add_argument_group("the deployment whose instances the membership may name (all or none)")
    who.add_argument("--deployment", help="the PDDeployment's name")
    who.add_argument("--namespace", help="its namespace")
    who.add_argument("--serving-port", type=int, help="its engines' serving port")
    p.add_argument("--retry-delay", type=float, default=0.2,
                   help="seconds before retrying a member that already failed (doubles each time)")
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between membership reads")
    p.add_argument("--prefix-routing", choices=MODES, default=DEFAULT_MODE,
                   help="choose prefill by the prompt prefix it is expected to hold, and load "
                        "(pd_operator.proxy.prefix_routing); off: by load alone")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    options.add_to(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    limits = options.limits_of(args, p)
    if len({args.port, args.admin_port, args.metrics_port}) != 3:
        p.error("--port, --admin-port and --metrics-port must differ")
    identity = (args.deployment, args.namespace, args.serving_port)
    if any(v is not None for v in identity) and any(v is None for v in identity):
        p.error("give --deployment, --namespace and --serving-port together, or none of them")
    addresses = (InstanceAddresses(Names(args.deployment, args.namespace), args.serving_port)
                 if args.deployment is not None else None)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("aiohttp.server", "aiohttp.web"):
        logging.getLogger(name).addFilter(WithoutRequestData())
    proxy = Proxy(args.membership, limits, retry_delay=args.retry_delay, poll_interval=args.poll_interval,
                  open_files=raise_open_file_limit(), api_key=os.environ.get(options.API_KEY_ENV),
                  addresses=addresses, admin_token=os.environ.get(options.ADMIN_TOKEN_ENV),
                  prefix_routing=args.prefix_routing)
    proxy.watch = configmap_watch(args.membership_configmap, KEY, args.service_account_dir, proxy.apply)
    asyncio.run(serve(proxy, args.host, args.port, args.admin_port, args.metrics_port))
    return 0

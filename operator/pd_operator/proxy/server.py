"""The pd-proxy process: an aiohttp server routing each request to a prefill member, then to a
decode member, by the membership file it re-reads while it runs.

Membership: with API access (a ServiceAccount token, --membership-configmap), the proxy watches its
ConfigMap (proxy/watch.py) and applies each change as the API server sends it. The mounted file is
the fallback: it is polled (content, not mtime: the kubelet replaces a projected ConfigMap by
swapping a symlink) and applied when there is no watch (no API access) or the watch never got
through, and when a watch that had applied the ConfigMap has been down longer than the file can lag
(watch.FILE_LAG_S); never sooner, since the kubelet's projection lags the API and an older version
could route to an instance that has left. A missing or malformed membership keeps the last good
one. New requests go only to current members; a request already in flight to an instance that left
finishes there.

Accounting (GET /pd/state, pd_operator.proxy.membership.ProxyState): per upstream name, the calls in
flight, and per prefill member the requests whose decode has not sent its first byte yet. The first
byte, not the response headers: a streaming answer's headers can leave before the engine has even
scheduled the request, while any body byte follows the first token, which decode produces only
after it pulled the KV.

Retries: a call that fails before anything went to the client is tried again on another member
of the role, up to --max-retries attempts per role; a 4xx answer is the request's own fault and goes
to the client as it is. Prefill fails alone: a 5xx, a broken connection or a body that is not an
answer is retried on another prefill member. A decode that could not be reached (the connection was
never made) is retried with the same KV parameters. Any other decode failure (a 5xx, a connection
that broke after the request went out, an answer ending before its first byte) may come after that
decode pulled the KV, and prefill frees a request's blocks once pulled: another decode reading the
same block ids could read blocks already given to another request (vllm-project/vllm-ascend:
vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py @ v0.30.0rc2 pulls by the
remote_block_ids it is sent). So the request is prefilled again, and the new blocks go to a decode
member not tried yet. It keeps its X-Request-Id: vLLM adds a random suffix to the id of each request
an engine takes (vllm-project/vllm: vllm/v1/engine/input_processor.py @ v0.34.0,
`assign_request_id`), so the first prefill's held blocks and the new ones stay apart. Once decode
has sent bytes nothing is retried. A request is prefilled at most --max-prefills times.

Bounds (api/types.py ProxyLimits, the options in options.py): it faces clients, so nothing a client
sends or withholds grows it without limit. A connection that has not sent a request's headers within
--header-timeout is closed (aiohttp's keep-alive timer runs from the connection's start and closes
it while no whole request has arrived); a body must be JSON, at most --max-body-bytes, whole within
--body-timeout, and fit in --max-buffered-bytes with every other body held, else the request is
answered 4xx or 503 before its body is read (bodies over 1/64 of the budget may fill only three
quarters of it: stalled large uploads leave room for ordinary requests). Requests past --max-
concurrent-requests are answered 503 with Retry-After, never queued. Open files: the open-file limit
is raised to its hard limit at start and split between client connections, upstream connections and
a reserve; past its share a new client connection closes the oldest connection that is between
requests (a half-sent one first), or is itself refused, so accept() never meets EMFILE. Engines get
--answer-timeout for a whole answer and --idle-timeout between stream chunks; a client that does not
read its stream for --idle-timeout loses it (decode's request is cancelled, so a drain does not wait
on it).

Separation: the clients' port serves only the OpenAI paths and /healthcheck (the readiness probe);
/pd/state and /reset_prefix_cache are on --admin-port, which the Service does not expose and the
NetworkPolicy admits only from the operator's namespace (render/policy.py). With an API key (the
env options.API_KEY_ENV, from the Secret spec.proxy.apiKey names) every other path of the clients' port
wants `Authorization: Bearer <key>` (compared in constant time), and the engines get the same key.
Error answers name roles and instance names (`glm-flash-decode-1`), never upstream URLs or DNS
names; the log has the detail.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import resource
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from pd_operator.api.types import ROLES, ProxyLimits
from pd_operator.proxy import options
from pd_operator.proxy.balancer import Awaiting, Balancer
from pd_operator.proxy.membership import KEY, MOUNT_DIR, STATE_PATH, Upstream, parse_document, state_document
from pd_operator.proxy.protocol import (
    EventFramer,
    cached_tokens,
    decode_request,
    kv_params,
    patch_answer,
    prefill_request,
)
from pd_operator.proxy.watch import SERVICE_ACCOUNT_DIR, ConfigMapWatch, configmap_watch

log = logging.getLogger("pd_operator.proxy")

HEALTH_PATH = "/healthcheck"
RESET_PATH = "/reset_prefix_cache"
COMPLETIONS = ("/v1/completions", "/v1/chat/completions")
MODELS_TIMEOUT_S = 5.0
UPSTREAM_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
NOT_DELIVERED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""No connection was made: the member received nothing of the request."""
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""An X-Request-Id the proxy passes on: it goes into engine headers, bodies and KV parameters."""
RETRY_AFTER_S = "1"
SMALL_BODY_SHARE = 64
SMALL_RESERVE = 4
"""A body over 1/SMALL_BODY_SHARE of --max-buffered-bytes may not take its last 1/SMALL_RESERVE."""
FD_RESERVE = 64
"""Open files kept for everything but connections: listening sockets, the log, the event loop,
membership reads, admin connections."""
ADMIN_CONNECTIONS = 16
_UNREAD = object()
Result = TypeVar("Result")


@dataclass(frozen=True)
class ErrorAnswer:
    """An upstream's answer of 400 or more: a 4xx goes to the client as it is, a 5xx is
    tried again on another member."""

    status: int
    body: bytes
    content_type: str | None

    @classmethod
    async def read(cls, resp: aiohttp.ClientResponse) -> ErrorAnswer:
        return cls(resp.status, await resp.read(), resp.headers.get("Content-Type"))


class Reprefill(Exception):
    """Decode failed after it may have pulled the request's KV: prefill the request again."""

    def __init__(self, answer: web.Response, why: str) -> None:
        super().__init__(why)
        self.answer, self.why = answer, why


@dataclass
class Tries:
    """One request's attempts on one role: the members tried, and how many attempts went out."""

    limit: int
    members: set[str] = field(default_factory=set)
    count: int = 0

    @property
    def spent(self) -> bool:
        return self.count >= self.limit


def error(status: int, message: str, type_: str, headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI-style error answer."""
    return web.json_response({"error": {"message": message, "type": type_, "code": status}}, status=status,
                             headers=headers)


def invalid(status: int, message: str) -> web.Response:
    return error(status, message, "invalid_request_error")


def busy(message: str) -> web.Response:
    return error(503, message, "overloaded", {"Retry-After": RETRY_AFTER_S})


def forwarded(status: int, body: bytes, content_type: str | None) -> web.Response:
    headers = {"Content-Type": content_type or "application/json"}
    return web.Response(status=status, body=body, headers=headers)


def failure(role: str, upstream: Upstream, err: BaseException) -> web.Response:
    """The client's answer for a call that failed without an engine's answer: the instance by name
    and the kind of failure; the exception's text (URLs, DNS names) stays in the log."""
    if isinstance(err, TimeoutError):
        return error(504, f"{role} instance {upstream.name} did not answer in time", "upstream_timeout")
    return error(502, f"{role} instance {upstream.name} failed: {type(err).__name__}", "upstream_error")


def why(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


class ClientStalled(Exception):
    """A client read nothing of its stream for the idle timeout."""


class BadRequest(Exception):
    """The client's request cannot be served as sent: its answer."""

    def __init__(self, answer: web.Response, close: bool = False) -> None:
        super().__init__(answer.text)
        if close:  # the rest of the body is not read: the connection cannot carry another request
            answer.force_close()
        self.answer = answer


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


class Proxy:
    def __init__(self, membership: Path, limits: ProxyLimits | None = None, *, retry_delay: float = 0.2,
                 poll_interval: float = 1.0, connect_timeout: float = 10.0, open_files: int = 1 << 20,
                 api_key: str | None = None) -> None:
        self.path = membership
        self.limits = limits or ProxyLimits()
        self.capacity = Capacity.of(self.limits, open_files)
        self.attempts = self.limits.max_retries
        self.retry_delay = retry_delay
        self.poll_interval = poll_interval
        self.connect_timeout = connect_timeout
        self.api_key = api_key or None
        self._key_digest = hashlib.sha256(api_key.encode()).digest() if api_key else b""
        self.balancer = Balancer()
        self.active = 0
        self.buffered = 0
        """Body bytes held by requests in flight (limits.max_buffered_bytes)."""
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
            membership = parse_document(json.loads(data))
        except ValueError as err:
            log.warning("%s is malformed: %s; %s", source, err, keeping)
            return
        if membership.version != self.balancer.version:
            log.info("membership version %s -> %s from %s: prefill %s, decode %s", self.balancer.version,
                     membership.version, source, [u.name for u in membership.prefill],
                     [u.name for u in membership.decode])
        self.balancer.update(membership)

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
        app.router.add_get("/v1/models", self.models)
        app.router.add_get(HEALTH_PATH, self.healthcheck)
        app.cleanup_ctx.append(self._lifetime)
        return app

    def admin_app(self) -> web.Application:
        """The admin port: what the operator reads, and what acts on every engine."""
        app = web.Application(client_max_size=4096)
        app.router.add_get(STATE_PATH, self.state)
        app.router.add_post(RESET_PATH, self.reset_prefix_cache)
        app.router.add_get(HEALTH_PATH, self.healthcheck)
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
        for a new one), the key checked, counted against the concurrency cap."""
        self.busy.add(request.protocol)
        try:
            if request.path == HEALTH_PATH:
                return await handler(request)
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
        finally:
            self.busy.discard(request.protocol)

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        digest = hashlib.sha256(token.strip().encode()).digest()
        return hmac.compare_digest(digest, self._key_digest) and scheme.lower() == "bearer"

    def _headers(self, request_id: str) -> dict[str, str]:
        """X-Request-Id for both calls, and the engines' API key when there is one (as vLLM's
        --api-key wants it: vllm-project/vllm: vllm/entrypoints/serve/middleware/authenticate.py
        @ v0.34.0). A client's own Authorization is never passed on."""
        out = {"X-Request-Id": request_id}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    # --- the request body ---------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> tuple[dict, int]:
        """The request's JSON object and the bytes reserved for it in self.buffered (the caller
        releases them). Raises BadRequest."""
        given = request.headers.get("Content-Type")
        if given is not None and not (request.content_type == "application/json"
                                      or request.content_type.endswith("+json")):
            raise BadRequest(invalid(415, "the body must be JSON (Content-Type application/json, not "
                                          f"{request.content_type[:64]})"))
        limit = self.limits.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise BadRequest(invalid(413, f"the body is {length} bytes; at most {limit}"), close=True)
        reserved = 0

        def reserve(n: int) -> None:
            nonlocal reserved
            if self.buffered + n > self._room(reserved + n):
                raise BadRequest(busy("the proxy holds as many request bodies as it may; retry later"),
                                 close=True)
            self.buffered += n
            reserved += n

        try:
            reserve(length or 0)
            data = bytearray()
            async with asyncio.timeout(self.limits.body_timeout_seconds):
                while chunk := await request.content.readany():
                    if len(data) + len(chunk) > limit:
                        raise BadRequest(invalid(413, f"the body is over {limit} bytes"), close=True)
                    if len(data) + len(chunk) > reserved:  # a chunked body, or longer than it said
                        reserve(len(data) + len(chunk) - reserved)
                    data += chunk
        except TimeoutError:
            self.buffered -= reserved
            late = f"the body did not arrive within {self.limits.body_timeout_seconds:g} s"
            raise BadRequest(invalid(408, late), close=True) from None
        except BaseException:
            self.buffered -= reserved
            raise
        try:
            body = json.loads(data)
        except RecursionError:
            problem = "the body is JSON nested too deeply"
        except ValueError:
            problem = "the body is not JSON"
        else:
            if isinstance(body, dict):
                return body, reserved
            problem = "the body is not a JSON object"
        self.buffered -= reserved
        raise BadRequest(invalid(400, problem))

    def _room(self, body: int) -> int:
        """What self.buffered may reach with a body of `body` bytes: large bodies may fill only part
        of the budget, so uploads of large bodies that stall (or crowd in) leave room for ordinary
        requests."""
        budget = self.limits.max_buffered_bytes
        return budget if body <= budget // SMALL_BODY_SHARE else budget - budget // SMALL_RESERVE

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
            body, reserved = await self._body(request)
        except BadRequest as bad:
            return bad.answer
        try:
            return await self._route(request, path, body, client_id)
        finally:
            self.buffered -= reserved

    async def _route(self, request: web.Request, path: str, body: dict, client_id: str | None
                     ) -> web.StreamResponse:
        missing = [role for role in ROLES if not self.balancer.listed(role)]
        if missing:
            return error(503, f"no {' and no '.join(missing)} instance to route to (membership version "
                         f"{self.balancer.version})", "no_upstream")
        if not self.balancer.members("prefill"):
            return error(503, "no prefill and decode instances of one KV layout to route to (membership "
                         f"version {self.balancer.version})", "no_upstream")
        if client_id:  # the example proxy passes the client's id in the body too
            body = {**body, "request_id": client_id}
        headers = self._headers(client_id or str(uuid.uuid4()))
        decode = Tries(self.attempts)
        prefills = 0
        while True:
            prefilled = await self._prefill(path, body, headers)
            if isinstance(prefilled, web.Response):
                return prefilled
            prefills += 1
            upstream, answer = prefilled
            awaiting = self.balancer.awaiting_decode(upstream)
            try:
                return await self._decode(request, path, decode_request(body, answer), headers,
                                          cached_tokens(answer), awaiting, decode, upstream.layout)
            except Reprefill as failed:
                if decode.spent or prefills >= self.limits.max_prefills:
                    return failed.answer
                log.info("prefilling request %s again: decode may have pulled the KV %s computed",
                         headers["X-Request-Id"], upstream.name)
            finally:
                awaiting.done()

    async def _prefill(self, path: str, body: dict, headers: dict[str, str]
                       ) -> tuple[Upstream, dict] | web.Response:
        timeout = aiohttp.ClientTimeout(sock_connect=self.connect_timeout,
                                        sock_read=self.limits.answer_timeout_seconds)

        async def call(upstream: Upstream) -> tuple[Upstream, dict] | ErrorAnswer:
            async with self.session.post(upstream.url + path, json=prefill_request(body),
                                         headers=headers, timeout=timeout) as resp:
                if resp.status >= 400:
                    return await ErrorAnswer.read(resp)
                answer = json.loads(await resp.read())
            kv_params(answer)  # raises ValueError: no KV location, so nothing decode could pull
            return upstream, answer
        # An answer that is not a JSON object with KV parameters is that instance's failure too:
        # try another.
        return await self._with_retries("prefill", call, (*UPSTREAM_ERRORS, ValueError))

    async def _decode(self, request: web.Request, path: str, body: dict, headers: dict[str, str],
                      cached: int, awaiting: Awaiting, tries: Tries, layout: str) -> web.StreamResponse:
        """Decode's answer, from a member on the prefill's KV `layout` not in `tries` yet while there
        is one. Raises Reprefill, also when no decode member of that layout is left (the last one
        left the membership during a rollout after the prefill began): another prefill pairs."""
        stream = bool(body.get("stream", False))
        if not self.balancer.members("decode", layout):
            tries.count += 1  # an attempt, so a membership that keeps changing cannot loop forever
            raise Reprefill(error(503, f"no decode instance of KV layout {layout or '(none)'} to route to",
                                  "no_upstream"), "no decode instance of its KV layout is left")
        limits = self.limits
        timeout = aiohttp.ClientTimeout(sock_connect=self.connect_timeout, sock_read=(
            limits.idle_timeout_seconds if stream else limits.answer_timeout_seconds))

        async def call(upstream: Upstream) -> web.StreamResponse | ErrorAnswer:
            def again(err: BaseException | None, answer: web.Response | None = None) -> Reprefill:
                reason = why(err) if err else "the answer ended before its first byte"
                return Reprefill(answer or (failure("decode", upstream, err) if err else error(
                    502, f"decode instance {upstream.name} failed: {reason}", "upstream_error")), reason)
            try:
                async with self.session.post(upstream.url + path, json=body, headers=headers,
                                             timeout=timeout) as resp:
                    try:
                        if resp.status >= 400:
                            answer = await ErrorAnswer.read(resp)
                            if answer.status < 500:
                                return answer
                            raise Reprefill(forwarded(answer.status, answer.body, answer.content_type),
                                            f"HTTP {answer.status}")
                        first = await resp.content.readany()
                    except UPSTREAM_ERRORS as err:
                        raise again(err) from err
                    if not first:
                        raise again(None)
                    awaiting.done()  # decode has its first token: it pulled the KV
                    if stream:
                        return await self._relay(request, resp, upstream, first, cached)
                    try:
                        rest = await resp.read()
                    except UPSTREAM_ERRORS as err:
                        # Not retried: bytes of the answer came, so decode had pulled the KV.
                        log.warning("decode call to %s broke after its first bytes: %s", upstream.name,
                                    why(err))
                        return failure("decode", upstream, err)
                    return forwarded(resp.status, patch_answer(first + rest, cached),
                                     resp.headers.get("Content-Type"))
            except NOT_DELIVERED:
                raise
            except UPSTREAM_ERRORS as err:  # the request went out (or may have): decode may have pulled
                raise again(err) from err
        return await self._with_retries("decode", call, NOT_DELIVERED, tries, layout)

    async def _with_retries(self, role: str, call: Callable[[Upstream], Awaitable[Result | ErrorAnswer]],
                            retry_on: tuple[type[Exception], ...], tries: Tries | None = None,
                            layout: str | None = None) -> Result | web.Response:
        """Run `call` on members of `role` until it gives a result or a 4xx, while `tries` (by default
        `self.attempts` for this call alone) has attempts left. Each attempt goes to a member not
        tried yet (once every member was, after a doubling delay) and counts as in flight on it; a
        5xx or an exception in `retry_on` is logged and tried again, and that member rests
        (balancer.py). A Reprefill from `call` is logged the same way and raised. When the
        attempts run out, the client gets the last failure."""
        tries = tries or Tries(self.attempts)
        last = error(503, f"no {role} instance to route to", "no_upstream")
        while not tries.spent:
            upstream = self.balancer.pick(role, tries.members, layout)
            if upstream is None:
                break
            if upstream.name in tries.members:  # every member failed once: back off
                await asyncio.sleep(self.retry_delay * 2 ** (tries.count - 1))
            tries.members.add(upstream.name)
            tries.count += 1
            again: Reprefill | None = None
            with self.balancer.serving(upstream, role):
                try:
                    result = await call(upstream)
                except retry_on as err:
                    reason, last = why(err), failure(role, upstream, err)
                except Reprefill as err:
                    reason, again = err.why, err
                else:
                    if not isinstance(result, ErrorAnswer):
                        self.balancer.answered(upstream, role)
                        return result
                    last = forwarded(result.status, result.body, result.content_type)
                    if result.status < 500:
                        self.balancer.answered(upstream, role)
                        return last
                    reason = f"HTTP {result.status}"
                self.balancer.failed(upstream, role)
            log.warning("%s call to %s failed (attempt %d of %d): %s", role, upstream.name, tries.count,
                        tries.limit, reason)
            if again is not None:
                raise again
        return last

    async def _relay(self, request: web.Request, resp: aiohttp.ClientResponse, upstream: Upstream,
                     first: bytes, cached: int) -> web.StreamResponse:
        """Stream decode's answer to the client once its first bytes arrived; an upstream or client
        failure from here on ends the stream (nothing can be retried after bytes went out), and so
        does a client that reads nothing for the idle timeout (decode's call is closed with it)."""
        out = web.StreamResponse(status=resp.status, headers={
            "Content-Type": resp.headers.get("Content-Type") or "text/event-stream; charset=utf-8"})
        framer = EventFramer(cached)
        idle = self.limits.idle_timeout_seconds

        async def send(data: bytes) -> None:
            try:
                async with asyncio.timeout(idle):
                    await out.write(data)
            except TimeoutError:
                raise ClientStalled from None

        try:
            await out.prepare(request)
            data = framer.feed(first)
            while True:
                if data:
                    await send(data)
                chunk = await resp.content.readany()
                if not chunk:
                    break
                data = framer.feed(chunk)
            if rest := framer.flush():
                await send(rest)
        except ClientStalled:
            log.warning("a client read nothing of its stream from decode instance %s for %g s: closed",
                        upstream.name, idle)
            request.protocol.force_close()
        except UPSTREAM_ERRORS as err:
            log.warning("stream from decode instance %s ended early: %s", upstream.name, why(err))
        return out

    # --- the rest of the API ------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        """The first member's /v1/models (prefill members first, as the example proxy asks)."""
        failures = []
        headers = self._headers(str(uuid.uuid4()))
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
                                                 headers=self._headers(str(uuid.uuid4())),
                                                 timeout=timeout) as resp:
                        if resp.status >= 400:
                            failures.append(f"{upstream.name}: HTTP {resp.status}")
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


async def serve(proxy: Proxy, host: str, port: int, admin_port: int) -> None:
    """Both ports until SIGTERM or SIGINT. The header timeout is aiohttp's keep-alive timeout: its
    timer starts with the connection and closes it while no whole request has arrived."""
    header = proxy.limits.header_timeout_seconds
    runners = [web.AppRunner(app, handler_cancellation=True, access_log=None, keepalive_timeout=header)
               for app in (proxy.app(), proxy.admin_app())]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    servers: list[asyncio.Server] = []
    try:
        for runner in runners:
            await runner.setup()
        (clients, admin), capacity = [r.server for r in runners], proxy.capacity
        assert clients is not None and admin is not None, "set up above"
        servers.append(await loop.create_server(
            Connections(clients, capacity.clients, proxy.busy, "clients"), host, port))
        servers.append(await loop.create_server(
            Connections(admin, ADMIN_CONNECTIONS, set(), "admin"), host, admin_port))
        log.info("serving clients on %s:%d, admin on %s:%d; open files %d: %d requests at once, %d "
                 "client and %d upstream connections", host, port, host, admin_port, capacity.open_files,
                 capacity.requests, capacity.clients, capacity.upstream)
        if capacity.requests < proxy.limits.max_concurrent_requests:
            log.warning("the open-file limit (%d) holds %d requests at once, not maxConcurrentRequests %d",
                        capacity.open_files, capacity.requests, proxy.limits.max_concurrent_requests)
        await stop.wait()
    finally:
        for server in servers:
            server.close()
        for runner in reversed(runners):
            await runner.cleanup()


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
    p.add_argument("--retry-delay", type=float, default=0.2,
                   help="seconds before retrying a member that already failed (doubles each time)")
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between membership reads")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    options.add_to(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    limits = options.limits_of(args, p)
    if args.admin_port == args.port:
        p.error("--admin-port must differ from --port")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    proxy = Proxy(args.membership, limits, retry_delay=args.retry_delay, poll_interval=args.poll_interval,
                  open_files=raise_open_file_limit(), api_key=os.environ.get(options.API_KEY_ENV))
    proxy.watch = configmap_watch(args.membership_configmap, KEY, args.service_account_dir, proxy.apply)
    asyncio.run(serve(proxy, args.host, args.port, args.admin_port))
    return 0

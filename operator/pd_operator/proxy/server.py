"""The pd-proxy process: an aiohttp server routing each request to a prefill member, then to a
decode member, by the membership file it re-reads while it runs.

Membership: the file is polled (content, not mtime: the kubelet replaces a projected ConfigMap by
swapping a symlink); a missing or malformed file keeps the last good membership. New requests go
only to current members; a request already in flight to an instance that left finishes there.

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
has sent bytes nothing is retried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import aiohttp
from aiohttp import web

from pd_operator.api.types import ROLES
from pd_operator.proxy.balancer import Awaiting, Balancer
from pd_operator.proxy.membership import KEY, MOUNT_DIR, STATE_PATH, Upstream, parse_document, state_document
from pd_operator.proxy.protocol import (
    EventFramer,
    cached_tokens,
    decode_request,
    patch_answer,
    prefill_request,
)

log = logging.getLogger("pd_operator.proxy")

HEALTH_PATH = "/healthcheck"
COMPLETIONS = ("/v1/completions", "/v1/chat/completions")
MODELS_TIMEOUT_S = 5.0
UPSTREAM_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
NOT_DELIVERED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""No connection was made: the member received nothing of the request."""
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


def error(status: int, message: str, type_: str) -> web.Response:
    """An OpenAI-style error answer."""
    return web.json_response({"error": {"message": message, "type": type_, "code": status}}, status=status)


def forwarded(status: int, body: bytes, content_type: str | None) -> web.Response:
    headers = {"Content-Type": content_type or "application/json"}
    return web.Response(status=status, body=body, headers=headers)


class Proxy:
    def __init__(self, membership: Path, *, max_retries: int = 3, retry_delay: float = 0.2,
                 poll_interval: float = 1.0, connect_timeout: float = 10.0) -> None:
        self.path = membership
        self.attempts = max(1, max_retries)
        self.retry_delay = retry_delay
        self.poll_interval = poll_interval
        self.connect_timeout = connect_timeout
        self.balancer = Balancer()
        self.active = 0
        self._seen: bytes | None | object = _UNREAD
        self._session: aiohttp.ClientSession | None = None

    # --- membership ---------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the membership file; apply it when its content changed and is good."""
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
        keeping = (f"keeping version {self.balancer.version}" if self.balancer.version
                   else "no upstreams until it is good")
        if data is None:
            log.warning("membership file %s %s; %s", self.path, why, keeping)
            return
        try:
            membership = parse_document(json.loads(data))
        except ValueError as err:
            log.warning("membership file %s is malformed: %s; %s", self.path, err, keeping)
            return
        if membership.version != self.balancer.version:
            log.info("membership version %s -> %s: prefill %s, decode %s", self.balancer.version,
                     membership.version, [u.name for u in membership.prefill],
                     [u.name for u in membership.decode])
        self.balancer.update(membership)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            self.reload()

    # --- the app ------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        for path in COMPLETIONS:
            app.router.add_post(path, self._completions_of(path))
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get(HEALTH_PATH, self.healthcheck)
        app.router.add_get(STATE_PATH, self.state)
        app.cleanup_ctx.append(self._lifetime)
        return app

    async def _lifetime(self, app: web.Application) -> AsyncIterator[None]:
        self.reload()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))
        watcher = asyncio.create_task(self._watch())
        yield
        watcher.cancel()
        await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "used before the app started"
        return self._session

    def _headers(self, request: web.Request, request_id: str) -> dict[str, str]:
        """X-Request-Id for both calls; the engines' API key from OPENAI_API_KEY (as the example
        proxy sends it), else the client's own Authorization."""
        out = {"X-Request-Id": request_id}
        if key := os.environ.get("OPENAI_API_KEY"):
            out["Authorization"] = f"Bearer {key}"
        elif auth := request.headers.get("Authorization"):
            out["Authorization"] = auth
        return out

    # --- completions --------------------------------------------------------------------------------

    def _completions_of(self, path: str) -> Callable:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.completions(request, path)
        return handler

    async def completions(self, request: web.Request, path: str) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the request body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the request body is not a JSON object", "invalid_request_error")
        missing = [role for role in ROLES if not self.balancer.members(role)]
        if missing:
            return error(503, f"no {' and no '.join(missing)} instance to route to (membership version "
                         f"{self.balancer.version}, file {self.path})", "no_upstream")
        client_id = request.headers.get("X-Request-Id")
        if client_id:  # the example proxy passes the client's id in the body too
            body = {**body, "request_id": client_id}
        headers = self._headers(request, client_id or str(uuid.uuid4()))
        self.active += 1
        decode = Tries(self.attempts)
        try:
            while True:
                prefilled = await self._prefill(path, body, headers)
                if isinstance(prefilled, web.Response):
                    return prefilled
                upstream, answer = prefilled
                awaiting = self.balancer.awaiting_decode(upstream)
                try:
                    return await self._decode(request, path, decode_request(body, answer), headers,
                                              cached_tokens(answer), awaiting, decode)
                except Reprefill as failed:
                    if decode.spent:
                        return failed.answer
                    log.info("prefilling request %s again: decode may have pulled the KV %s computed",
                             headers["X-Request-Id"], upstream.name)
                finally:
                    awaiting.done()
        finally:
            self.active -= 1

    async def _prefill(self, path: str, body: dict, headers: dict[str, str]
                       ) -> tuple[Upstream, dict] | web.Response:
        async def call(upstream: Upstream) -> tuple[Upstream, dict] | ErrorAnswer:
            async with self.session.post(upstream.url + path, json=prefill_request(body),
                                         headers=headers) as resp:
                if resp.status >= 400:
                    return await ErrorAnswer.read(resp)
                answer = json.loads(await resp.read())
            if not isinstance(answer, dict):
                raise ValueError("the answer is not a JSON object")
            return upstream, answer
        # An answer that is not a JSON object is that instance's failure too: try another.
        return await self._with_retries("prefill", call, (*UPSTREAM_ERRORS, ValueError))

    async def _decode(self, request: web.Request, path: str, body: dict, headers: dict[str, str],
                      cached: int, awaiting: Awaiting, tries: Tries) -> web.StreamResponse:
        """Decode's answer, from a member not in `tries` yet while there is one. Raises Reprefill."""
        stream = bool(body.get("stream", False))

        async def call(upstream: Upstream) -> web.StreamResponse | ErrorAnswer:
            def again(why: str, answer: web.Response | None = None) -> Reprefill:
                return Reprefill(answer or error(502, f"decode instance {upstream.name} failed: {why}",
                                                 "upstream_error"), why)
            try:
                async with self.session.post(upstream.url + path, json=body, headers=headers) as resp:
                    try:
                        if resp.status >= 400:
                            answer = await ErrorAnswer.read(resp)
                            if answer.status < 500:
                                return answer
                            raise again(f"HTTP {answer.status}",
                                        forwarded(answer.status, answer.body, answer.content_type))
                        first = await resp.content.readany()
                    except UPSTREAM_ERRORS as err:
                        raise again(f"{type(err).__name__}: {err}") from err
                    if not first:
                        raise again("the answer ended before its first byte")
                    awaiting.done()  # decode has its first token: it pulled the KV
                    if stream:
                        return await self._relay(request, resp, upstream, first, cached)
                    try:
                        rest = await resp.read()
                    except UPSTREAM_ERRORS as err:
                        # Not retried: bytes of the answer came, so decode had pulled the KV.
                        why = f"{type(err).__name__}: {err}"
                        log.warning("decode call to %s broke after its first bytes: %s", upstream.name, why)
                        return error(502, f"decode instance {upstream.name} failed after it began to answer: "
                                          f"{why}", "upstream_error")
                    return forwarded(resp.status, patch_answer(first + rest, cached),
                                     resp.headers.get("Content-Type"))
            except NOT_DELIVERED:
                raise
            except UPSTREAM_ERRORS as err:  # the request went out (or may have): decode may have pulled
                raise again(f"{type(err).__name__}: {err}") from err
        return await self._with_retries("decode", call, NOT_DELIVERED, tries)

    async def _with_retries(self, role: str, call: Callable[[Upstream], Awaitable[Result | ErrorAnswer]],
                            retry_on: tuple[type[Exception], ...], tries: Tries | None = None
                            ) -> Result | web.Response:
        """Run `call` on members of `role` until it gives a result or a 4xx, while `tries` (by default
        `self.attempts` for this call alone) has attempts left. Each attempt goes to a member not
        tried yet (once every member was, after a doubling delay) and counts as in flight on it; a
        5xx or an exception in `retry_on` is logged and tried again, and that member rests
        (balancer.py). A Reprefill from `call` is logged the same way and raised. When the
        attempts run out, the client gets the last failure."""
        tries = tries or Tries(self.attempts)
        last = error(503, f"no {role} instance to route to", "no_upstream")
        while not tries.spent:
            upstream = self.balancer.pick(role, tries.members)
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
                    why = f"{type(err).__name__}: {err}"
                    last = error(502, f"{role} instance {upstream.name} failed: {why}", "upstream_error")
                except Reprefill as err:
                    why, again = err.why, err
                else:
                    if not isinstance(result, ErrorAnswer):
                        self.balancer.answered(upstream, role)
                        return result
                    last = forwarded(result.status, result.body, result.content_type)
                    if result.status < 500:
                        self.balancer.answered(upstream, role)
                        return last
                    why = f"HTTP {result.status}"
                self.balancer.failed(upstream, role)
            log.warning("%s call to %s failed (attempt %d of %d): %s", role, upstream.name, tries.count,
                        tries.limit, why)
            if again is not None:
                raise again
        return last

    async def _relay(self, request: web.Request, resp: aiohttp.ClientResponse, upstream: Upstream,
                     first: bytes, cached: int) -> web.StreamResponse:
        """Stream decode's answer to the client once its first bytes arrived; an upstream or client
        failure from here on ends the stream (nothing can be retried after bytes went out)."""
        out = web.StreamResponse(status=resp.status, headers={
            "Content-Type": resp.headers.get("Content-Type") or "text/event-stream; charset=utf-8"})
        framer = EventFramer(cached)
        try:
            await out.prepare(request)
            data = framer.feed(first)
            while True:
                if data:
                    await out.write(data)
                chunk = await resp.content.readany()
                if not chunk:
                    break
                data = framer.feed(chunk)
            if rest := framer.flush():
                await out.write(rest)
        except UPSTREAM_ERRORS as err:
            log.warning("stream from decode instance %s ended early: %s: %s", upstream.name,
                        type(err).__name__, err)
        return out

    # --- the rest of the API ------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        """The first member's /v1/models (prefill members first, as the example proxy asks)."""
        failures = []
        headers = self._headers(request, str(uuid.uuid4()))
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
                    failures.append(f"{upstream.name}: {type(err).__name__}: {err}")
        return error(503, f"no instance answered /v1/models ({'; '.join(failures) or 'no members'})",
                     "no_upstream")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        failures = []
        for role in ROLES:
            for upstream in self.balancer.members(role):
                try:
                    async with self.session.post(upstream.url + "/reset_prefix_cache",
                                                 params=dict(request.query)) as resp:
                        if resp.status >= 400:
                            failures.append(f"{upstream.name}: HTTP {resp.status}")
                except UPSTREAM_ERRORS as err:
                    failures.append(f"{upstream.name}: {type(err).__name__}: {err}")
        return web.json_response({"failed": failures}, status=500) if failures else web.Response()

    async def healthcheck(self, request: web.Request) -> web.Response:
        """200 only with at least one prefill and one decode member (the readiness probe)."""
        counts = {role: len(self.balancer.members(role)) for role in ROLES}
        ok = all(counts.values())
        return web.json_response({"status": "ok" if ok else "no upstreams", "version": self.balancer.version,
                                  "prefill_instances": counts["prefill"],
                                  "decode_instances": counts["decode"], "request_num": self.active},
                                 status=200 if ok else 503)

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response(state_document(self.balancer.state()))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pd-proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--membership", type=Path, default=Path(MOUNT_DIR) / KEY,
                   help="the membership file (pd_operator.proxy.membership.document), re-read while running")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-retries", type=int, default=3,
                   help="attempts per call before the client gets the error (as the example proxy's)")
    p.add_argument("--retry-delay", type=float, default=0.2,
                   help="seconds before retrying a member that already failed (doubles each time)")
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between membership reads")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    proxy = Proxy(args.membership, max_retries=args.max_retries, retry_delay=args.retry_delay,
                  poll_interval=args.poll_interval)
    web.run_app(proxy.app(), host=args.host, port=args.port, handler_cancellation=True, access_log=None,
                print=lambda text: log.info("%s", text.strip()))
    return 0

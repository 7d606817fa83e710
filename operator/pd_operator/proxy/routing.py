"""How pd-proxy serves one completion: prefill on one member, then decode on a member of the same KV
layout with prefill's KV location, with retries.

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

Timeouts: engines get --answer-timeout for a whole answer and --idle-timeout between stream chunks; a
client that does not read its stream for --idle-timeout loses it (decode's request is cancelled, so a
drain does not wait on it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
from aiohttp import web

from pd_operator.api.types import ROLES, ProxyLimits
from pd_operator.proxy.answers import (
    NOT_DELIVERED,
    UPSTREAM_ERRORS,
    ClientStalled,
    ErrorAnswer,
    Reprefill,
    error,
    failure,
    forwarded,
    why,
)
from pd_operator.proxy.balancer import Awaiting, Balancer
from pd_operator.proxy.membership import Upstream
from pd_operator.proxy.metrics import ProxyMetrics, Timing
from pd_operator.proxy.prefix_routing import Prompt
from pd_operator.proxy.prompt_tokens import prompt_tokens
from pd_operator.proxy.protocol import (
    EventFramer,
    cached_tokens,
    decode_request,
    kv_params,
    patch_answer,
    prefill_request,
)

log = logging.getLogger("pd_operator.proxy")

Result = TypeVar("Result")


def engine_headers(request_id: str, api_key: str | None) -> dict[str, str]:
    """X-Request-Id for both calls, and the engines' API key when there is one (as vLLM's
    --api-key wants it: vllm-project/vllm: vllm/entrypoints/serve/middleware/authenticate.py
    @ v0.34.0). A client's own Authorization is never passed on."""
    out = {"X-Request-Id": request_id}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


@dataclass
class Tries:
    """One request's attempts on one role: the members tried, and how many attempts went out."""

    limit: int
    members: set[str] = field(default_factory=set)
    count: int = 0

    @property
    def spent(self) -> bool:
        return self.count >= self.limit


class Router:
    """Routes completions to the members `balancer` offers, over the session `session` gives (the
    proxy's, open while its app runs)."""

    def __init__(self, balancer: Balancer, limits: ProxyLimits, session: Callable[[], aiohttp.ClientSession],
                 *, retry_delay: float, connect_timeout: float, api_key: str | None,
                 metrics: ProxyMetrics) -> None:
        self.balancer = balancer
        self.limits = limits
        self.attempts = limits.max_retries
        self._session = session
        self.retry_delay = retry_delay
        self.connect_timeout = connect_timeout
        self.api_key = api_key
        self.metrics = metrics

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._session()

    async def route(self, request: web.Request, path: str, body: dict, client_id: str | None,
                    arrived: float) -> web.StreamResponse:
        missing = [role for role in ROLES if not self.balancer.listed(role)]
        if missing:
            return error(503, f"no {' and no '.join(missing)} instance to route to (membership version "
                         f"{self.balancer.version})", "no_upstream")
        if not self.balancer.members("prefill"):
            return error(503, "no prefill and decode instances of one KV layout to route to (membership "
                         f"version {self.balancer.version})", "no_upstream")
        if client_id:  # the example proxy passes the client's id in the body too
            body = {**body, "request_id": client_id}
        headers = engine_headers(client_id or str(uuid.uuid4()), self.api_key)
        decode = Tries(self.attempts)
        timing = Timing(path, arrived)
        prompt = self.balancer.prefix.prompt(prompt_tokens(path, body))
        prefills = 0
        while True:
            prefilled = await self._prefill(path, body, headers, prompt)
            if isinstance(prefilled, web.Response):
                return prefilled
            prefills += 1
            timing.prefilled = time.monotonic()
            upstream, answer = prefilled
            awaiting = self.balancer.awaiting_decode(upstream)
            try:
                return await self._decode(request, path, decode_request(body, answer), headers,
                                          cached_tokens(answer), awaiting, decode, upstream.layout, timing)
            except Reprefill as failed:
                if decode.spent or prefills >= self.limits.max_prefills:
                    return failed.answer
                self.metrics.reprefills.inc()
                log.info("prefilling request %s again: decode may have pulled the KV %s computed",
                         headers["X-Request-Id"], upstream.name)
            finally:
                awaiting.done()

    async def _prefill(self, path: str, body: dict, headers: dict[str, str], prompt: Prompt | None
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
        return await self._with_retries("prefill", call, (*UPSTREAM_ERRORS, ValueError), prompt=prompt)

    async def _decode(self, request: web.Request, path: str, body: dict, headers: dict[str, str],
                      cached: int, awaiting: Awaiting, tries: Tries, layout: str, timing: Timing
                      ) -> web.StreamResponse:
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
                    self.metrics.first_byte(timing)
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
                            layout: str | None = None, prompt: Prompt | None = None) -> Result | web.Response:
        """Run `call` on members of `role` until it gives a result or a 4xx, while `tries` (by default
        `self.attempts` for this call alone) has attempts left. Each attempt goes to a member not
        tried yet (once every member was, after a doubling delay) and counts as in flight on it; a
        5xx or an exception in `retry_on` is logged and tried again, and that member rests
        (balancer.py). A Reprefill from `call` is logged the same way and raised. When the
        attempts run out, the client gets the last failure."""
        tries = tries or Tries(self.attempts)
        last = error(503, f"no {role} instance to route to", "no_upstream")
        while not tries.spent:
            upstream = self.balancer.pick(role, tries.members, layout, prompt)
            if upstream is None:
                break
            if upstream.name in tries.members:  # every member failed once: back off
                await asyncio.sleep(self.retry_delay * 2 ** (tries.count - 1))
            tries.members.add(upstream.name)
            tries.count += 1
            if tries.count > 1:
                self.metrics.retries.labels(role).inc()
            again: Reprefill | None = None
            with self.balancer.serving(upstream, role, prompt):
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
                        self.balancer.answered(upstream, role, computed=False)
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

"""Fake vLLM engines in PD mode for proxy tests, and a client load to drive them through a proxy.

`FakeEngine` is a small aiohttp server on loopback answering /v1/completions and
/v1/chat/completions as a vLLM OpenAI server with vllm-ascend's Mooncake connector does:
- prefill checks it was asked for a remote decode (kv_transfer_params do_remote_decode, one token,
  no stream) and answers with where its blocks are (vllm-project/vllm-ascend:
  vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py @ v0.30.0rc2, `request_finished`:
  do_remote_prefill, remote_engine_id, remote_block_ids, remote_host, remote_port, remote_request_id);
- decode checks it got those parameters for this request, pulls the request's KV from the prefill
  engine they name (an HTTP stand-in for the Mooncake pull: each prefilled request's blocks can be
  pulled once, and a pull from an engine that is gone fails the request, as a real decode's would),
  then answers with `chunks` tokens, as server-sent events when streaming.
Each engine records what it received (by X-Request-Id, in one order across engines) and any
protocol violation, and can hold requests at a point until the test releases them (`Hold`: asyncio
events, no sleeps). For the proxy's error paths an engine can instead give every request one
`Canned` answer (an error as vLLM sends it, or a body no engine sends), or drop the connection in
the middle of its answer (`cut`) or right after it pulled the KV (`dies`); `refusing_url()` is an
upstream that refuses connections.
`kill()` stops an engine as a killed process stops: connections reset, requests in flight cut.

`Load` runs a few concurrent clients (streaming and not, completions and chat) and checks every
answer; `started_after(mark)` names the requests a client began after a point of the test.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from pd_operator.proxy.membership import STATE_PATH, ProxyState, Upstream, paired_as, parse_state
from pd_operator.proxy.options import ADMIN_TOKEN_ENV
from support.cluster import pick_port

HOST = "127.0.0.1"
MODEL = "fake-model"
CACHED_TOKENS = 7
"""Prompt tokens every fake prefill reports from its prefix cache (decode reports 0): the client
must see prefill's figure."""
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
"""What vllm-ascend's example proxy asks prefill for (vllm-project/vllm-ascend:
examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py @ v0.30.0rc2)."""
WAIT_S = 60.0
MAX_BODY_BYTES = 64 * 1024 * 1024
"""An engine takes bodies this large (aiohttp's default, 1 MiB, refuses a 100k-token prompt given as
token ids, which bench/routing.py sends)."""
KV_PULL_PATH = "/fake-kv/"
"""Where a fake prefill serves a request's blocks (the real pull is Mooncake's, not HTTP)."""


async def until(what: str, check: Callable[[], Any], timeout: float = WAIT_S, interval: float = 0.02) -> Any:
    """Poll `check` until it is truthy (a deadline for waiting, never an assertion on time). A
    check may return an awaitable (e.g. `asyncio.to_thread(...)` of a blocking API call): its result
    counts."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


class Hold:
    """Requests that reach a point of an engine wait here until `release()`: at most `limit` of
    them, and only those `match` accepts; the others pass."""

    def __init__(self, limit: int, match: Callable[[dict], bool] | None = None) -> None:
        self.limit, self.match = limit, match
        self.caught = 0
        self.waiting = 0
        self._released = asyncio.Event()

    async def __call__(self, body: dict) -> None:
        if self._released.is_set() or self.caught >= self.limit or (self.match and not self.match(body)):
            return
        self.caught += 1
        self.waiting += 1
        try:
            await self._released.wait()
        finally:
            self.waiting -= 1

    async def caught_at_least(self, n: int) -> None:
        await until(f"{n} request(s) held", lambda: self.caught >= n)

    def release(self) -> None:
        self._released.set()


_ARRIVALS = itertools.count()


@dataclass
class Received:
    request_id: str
    path: str
    body: dict
    authorization: str | None = None
    """The Authorization header the engine got (vLLM's --api-key checks it)."""
    order: int = field(default_factory=lambda: next(_ARRIVALS))
    """When it arrived, comparable across every engine of the process."""


@dataclass(frozen=True)
class Canned:
    """An answer an engine gives every request instead of its own."""

    status: int
    body: bytes
    content_type: str = "application/json"


def vllm_error(status: int, message: str) -> Canned:
    """An error as vLLM's OpenAI server answers it: JSON `ErrorResponse`, the HTTP status in
    error.code (vllm-project/vllm: vllm/entrypoints/serve/exception_handling/error_response.py and
    vllm/entrypoints/openai/completion/api_router.py @ v0.34.0)."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    error = {"message": message, "type": kind.get(status, "InternalServerError"), "param": None,
             "code": status}
    return Canned(status, json.dumps({"error": error}).encode())


def refusing_url() -> str:
    """A loopback URL nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    return f"http://{HOST}:{port}"


@dataclass
class FakeEngine:
    name: str
    role: str
    chunks: int = 4
    received: list[Received] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    holds: dict[str, Hold] = field(default_factory=dict)
    """Points: "answer" (prefill: before it answers; decode: after the response headers, before
    it pulls the KV and sends the first token), "stream" (decode, streaming: after the first token)
    and "cut" (see `cut`)."""
    canned: Canned | None = None
    """Every request gets this answer instead (after it is recorded, with no protocol check)."""
    cut: bool = False
    """Decode: send the first token (streaming) or half the whole answer, wait at point "cut",
    then drop the connection, as an engine pod that dies while answering."""
    dies: bool = False
    """Decode: pull the KV, then drop the connection before the first byte of the answer (the
    headers too unless streaming), as an engine pod that dies right after the pull."""
    prefill_s: float = 0.0
    """Prefill: how long computing a prompt takes (bench/proxy.py; tests leave it 0)."""
    token_s: float = 0.0
    """Decode, streaming: the time between two tokens."""
    pull_s: float = 0.0
    """Prefill: how long handing a request's KV to decode takes (a long prompt's transfer): the
    blocks stay held meanwhile, and an engine killed during it fails that pull."""
    host: str = HOST
    port: int = 0
    layout: str = ""
    """The kv-layout hash of the KV it computes (prefill) or pulls into (decode): a decode told to
    pull KV of a layout that does not pair as its own records an error (pd-proxy must never pair
    across layouts)."""
    pairs: dict[str, str] = field(default_factory=dict)
    """kv-layouts that pair as another, as the membership says (proxy/membership.py `pairs`: a
    decode-only block-size change), which the decode gates link by."""
    blocks: set[str] = field(default_factory=set)
    """Prefill: the requests whose KV decode has not pulled yet."""
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def upstream(self) -> Upstream:
        return Upstream(self.name, self.url)

    @property
    def ids(self) -> set[str]:
        return {r.request_id for r in self.received}

    def hold(self, point: str, limit: int = 1, match: Callable[[dict], bool] | None = None) -> Hold:
        self.holds[point] = hold = Hold(limit, match)
        return hold

    async def _at(self, point: str, body: dict) -> None:
        if point in self.holds:
            await self.holds[point](body)

    async def start(self) -> FakeEngine:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        for path in ("/v1/completions", "/v1/chat/completions"):
            app.router.add_post(path, self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get(KV_PULL_PATH + "{request_id}", self._pulled)
        # A client that goes away cancels its request, as vLLM aborts it.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S))
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            for hold in self.holds.values():
                hold.release()
            await self._close()

    async def kill(self) -> None:
        """Stop as a killed process does: nothing listens any more and every connection, requests
        in flight included, is reset (held requests are cut, not released)."""
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
            assert self._runner.server is not None
            for handler in self._runner.server.connections:
                if handler.transport is not None:
                    handler.transport.abort()
            await self._close()

    async def _close(self) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()
        self._runner = None

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def _refuse(self, request_id: str, problem: str) -> web.Response:
        self.errors.append(f"{self.name} {request_id}: {problem}")
        return web.json_response({"error": {"message": problem, "type": "BadRequestError", "code": 400}},
                                 status=400)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        request_id = request.headers.get("X-Request-Id", "")
        self.received.append(Received(request_id, request.path, body, request.headers.get("Authorization")))
        if self.canned:
            return web.Response(status=self.canned.status, body=self.canned.body,
                                headers={"Content-Type": self.canned.content_type})
        answer = self._prefill if self.role == "prefill" else self._decode
        return await answer(request, request_id, body)

    async def _drop(self, request: web.Request, out: web.StreamResponse, body: dict) -> web.StreamResponse:
        """Wait at point "cut", then close the connection in the middle of `out`."""
        await self._at("cut", body)
        assert request.transport is not None
        request.transport.close()
        return out

    async def _prefill(self, request: web.Request, request_id: str, body: dict) -> web.Response:
        problems = [f"{key}={body.get(key)!r}" for key, want in (("stream", False), ("max_tokens", 1),
                                                                 ("min_tokens", 1)) if body.get(key) != want]
        if body.get("kv_transfer_params") != PREFILL_PARAMS:
            problems.append(f"kv_transfer_params={body.get('kv_transfer_params')!r}")
        if "stream_options" in body or body.get("max_completion_tokens", 1) != 1:
            problems.append("stream_options or max_completion_tokens kept")
        if not request_id:
            problems.append("no X-Request-Id")
        if problems:
            return self._refuse(request_id, f"not a prefill request: {', '.join(problems)}")
        await self._at("answer", body)
        cached = await self._compute(body)
        self.blocks.add(request_id)
        chat = request.path.endswith("chat/completions")
        choice = ({"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": "x", "finish_reason": "length"})
        return web.json_response({
            "id": f"cmpl-{request_id}", "object": "chat.completion" if chat else "text_completion",
            "model": MODEL, "choices": [choice],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
                      "prompt_tokens_details": {"cached_tokens": cached}},
            "kv_transfer_params": {
                "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2, 3]],
                "remote_engine_id": self.name, "remote_request_id": request_id, "remote_host": self.host,
                "remote_port": self.port, "last_token_id": 0}})

    async def _compute(self, body: dict) -> int:
        """Prefill: compute the prompt; the prompt tokens it found cached."""
        if self.prefill_s:
            await asyncio.sleep(self.prefill_s)
        return CACHED_TOKENS

    async def _pulled(self, request: web.Request) -> web.Response:
        """Prefill: decode takes a request's blocks (once)."""
        request_id = request.match_info["request_id"]
        if request_id not in self.blocks:
            return web.json_response({"error": f"no blocks of {request_id}"}, status=404)
        if self.pull_s:
            await asyncio.sleep(self.pull_s)
        self.blocks.discard(request_id)
        return web.json_response({"request_id": request_id, "layout": self.layout})

    def _pairs_with(self, layout: str) -> bool:
        return paired_as(self.pairs, layout) == paired_as(self.pairs, self.layout)

    async def _pull(self, params: dict) -> str | None:
        """Decode: pull the request's KV from the prefill engine its parameters name; what failed."""
        assert self._session is not None
        url = f"http://{params['remote_host']}:{params['remote_port']}{KV_PULL_PATH}{params['remote_request_id']}"
        try:
            async with self._session.get(url) as resp:
                if resp.status != 200:
                    why = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                elif not self._pairs_with(layout := (await resp.json()).get("layout")):
                    why = f"its KV has layout {layout!r}, this engine's is {self.layout!r}"
                else:
                    return None
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            why = f"{type(err).__name__}: {err}"
        problem = (f"{self.name} {params['remote_request_id']}: KV pull from {params['remote_engine_id']} "
                   f"failed: {why}")
        self.errors.append(problem)
        return problem

    async def _decode(self, request: web.Request, request_id: str, body: dict) -> web.StreamResponse:
        params = body.get("kv_transfer_params") or {}
        problems = [f"{key}={params.get(key)!r}" for key, ok in (
            ("do_remote_prefill", lambda v: v is True), ("do_remote_decode", lambda v: v is False),
            ("remote_engine_id", lambda v: isinstance(v, str) and v),
            ("remote_block_ids", lambda v: isinstance(v, list) and v),
            ("remote_host", lambda v: isinstance(v, str) and v),
            ("remote_port", lambda v: isinstance(v, int)),
            ("remote_request_id", lambda v: v == request_id)) if not ok(params.get(key))]
        if body.get("max_tokens") == 1 or body.get("min_tokens") == 1:
            problems.append("the client's token limits were not restored")
        if problems:
            return self._refuse(request_id, f"not a decode request: {', '.join(problems)}")
        chat = request.path.endswith("chat/completions")
        tokens = [f"t{i} " for i in range(self.chunks)]
        usage = {"prompt_tokens": 5, "completion_tokens": len(tokens), "total_tokens": 5 + len(tokens),
                 "prompt_tokens_details": {"cached_tokens": 0}}
        if not body.get("stream"):
            await self._at("answer", body)
            if pull_failed := await self._pull(params):
                return web.json_response({"error": {"message": pull_failed, "type": "InternalServerError",
                                                    "code": 500}}, status=500)
            if self.dies:
                return await self._drop(request, web.StreamResponse(), body)
            text = "".join(tokens)
            message = {"role": "assistant", "content": text}
            choice = ({"index": 0, "message": message, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            whole = {"id": f"cmpl-{request_id}", "model": MODEL, "choices": [choice],
                     "object": "chat.completion" if chat else "text_completion", "usage": usage}
            if not self.cut:
                return web.json_response(whole)
            data = json.dumps(whole).encode()
            out = web.StreamResponse(headers={"Content-Type": "application/json"})
            out.content_length = len(data)
            await out.prepare(request)
            await out.write(data[:len(data) // 2])
            return await self._drop(request, out, body)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await out.prepare(request)  # headers leave before the first token, as vLLM's do

        def event(obj: Any) -> bytes:
            return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"

        await self._at("answer", body)
        if pull_failed := await self._pull(params):  # headers are out: the stream ends without [DONE]
            await out.write(event({"error": {"message": pull_failed, "type": "InternalServerError",
                                             "code": 500}}))
            await out.write_eof()
            return out
        if self.dies:
            return await self._drop(request, out, body)
        for i, token in enumerate(tokens):
            if i and self.token_s:
                await asyncio.sleep(self.token_s)
            last = i == len(tokens) - 1
            choice = ({"index": 0, "delta": {"content": token}, "finish_reason": "length" if last else None}
                      if chat else {"index": 0, "text": token, "finish_reason": "length" if last else None})
            await out.write(event({"id": f"cmpl-{request_id}", "model": MODEL, "choices": [choice],
                                   "object": "chat.completion.chunk" if chat else "text_completion"}))
            if i == 0:
                await self._at("stream", body)
                if self.cut:
                    return await self._drop(request, out, body)
        if (body.get("stream_options") or {}).get("include_usage"):
            await out.write(event({"id": f"cmpl-{request_id}", "model": MODEL, "choices": [],
                                   "usage": usage}))
        await out.write(event(b"[DONE]"))
        await out.write_eof()
        return out


def check_answer(status: int, raw: bytes, *, chat: bool, stream: bool, usage: bool,
                 chunks: int) -> str | None:
    """What is wrong with an answer the proxy gave a client (None: it is complete and right)."""
    if status != 200:
        return f"HTTP {status}: {raw[:300]!r}"
    want = "".join(f"t{i} " for i in range(chunks))
    if not stream:
        answer = json.loads(raw)
        choice = answer["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        if text != want or cached != CACHED_TOKENS:
            return f"answer text {text!r}, cached tokens {cached}"
        return None
    events = [e for e in raw.decode().split("\n\n") if e]
    if not events or events[-1] != "data: [DONE]":
        return f"the stream does not end with [DONE]: {raw[-200:]!r}"
    chunks_json = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    text = "".join((c["choices"][0]["delta"]["content"] if chat else c["choices"][0]["text"])
                   for c in chunks_json if c["choices"])
    if text != want:
        return f"streamed text {text!r}"
    if usage:
        tail = [c for c in chunks_json if not c["choices"]]
        if len(tail) != 1 or tail[0]["usage"]["prompt_tokens_details"]["cached_tokens"] != CACHED_TOKENS:
            return f"usage event {tail!r}"
    return None


@dataclass
class Load:
    """`clients` concurrent clients sending requests through `url` until `stop()`; every answer is
    checked (`failures`)."""

    url: str
    clients: int = 4
    chunks: int = 4
    started: list[str] = field(default_factory=list)
    completed: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    KINDS = [(chat, stream, usage) for chat in (False, True) for stream in (False, True)
             for usage in ((False, True) if stream else (False,))]

    async def __aenter__(self) -> Load:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S * 4))
        self._tasks = [asyncio.create_task(self._client(k)) for k in range(self.clients)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self._stop.set()
        if self._tasks:
            await asyncio.gather(*self._tasks)
            self._tasks = []
            await self._session.close()

    async def _client(self, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            chat, stream, usage = self.KINDS[(i + k) % len(self.KINDS)]
            i += 1
            request_id = f"client{k}-{i}"
            body: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "stream": stream}
            if chat:
                body |= {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 16}
            else:
                body["prompt"] = "hello"
            if usage:
                body["stream_options"] = {"include_usage": True}
            path = "/v1/chat/completions" if chat else "/v1/completions"
            self.started.append(request_id)
            try:
                async with self._session.post(self.url + path, json=body,
                                              headers={"X-Request-Id": request_id}) as resp:
                    raw = await resp.read()
                    problem = check_answer(resp.status, raw, chat=chat, stream=stream, usage=usage,
                                           chunks=self.chunks)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as err:
                problem = f"{type(err).__name__}: {err}"
            if problem:
                self.failures.append(f"{request_id} {path} stream={stream}: {problem}")
            self.completed.add(request_id)

    def mark(self) -> int:
        return len(self.started)

    def started_after(self, mark: int) -> set[str]:
        return set(self.started[mark:])

    async def completed_after(self, mark: int, n: int) -> None:
        await until(f"{n} requests started after mark {mark} completed",
                    lambda: len(self.started_after(mark) & self.completed) >= n)


async def started(*engines: FakeEngine) -> list[FakeEngine]:
    return list(await asyncio.gather(*(e.start() for e in engines)))


def project(path: Path, text: str) -> None:
    """Replace a file atomically (a temporary file, then a rename), as the kubelet swaps a projected
    ConfigMap."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def swap(path: Path, doc: dict) -> str:
    """Project a membership document as the proxy's file; its version."""
    project(path, json.dumps(doc))
    return str(doc["version"])


class ProxyProcess:
    """A `pd-proxy` process (`argv`) serving at host:port, its output in `log`."""

    def __init__(self, argv: list[str], host: str, port: int, log: Path, admin_port: int,
                 env: dict[str, str] | None = None, preexec_fn: Callable[[], None] | None = None,
                 metrics_port: int | None = None) -> None:
        self.argv, self.host, self.port, self.log, self.env = argv, host, port, log, env
        self.admin_port, self.metrics_port, self.preexec_fn = admin_port, metrics_port, preexec_fn
        self.url = f"http://{host}:{port}"
        self.admin_url = f"http://{host}:{admin_port}"
        self.metrics_url = f"http://{host}:{metrics_port}"
        self.proc: subprocess.Popen | None = None

    @classmethod
    def on_loopback(cls, membership: Path, log: Path, *extra: str, env: dict[str, str] | None = None,
                    preexec_fn: Callable[[], None] | None = None) -> ProxyProcess:
        """The installed `pd-proxy` console script on 127.0.0.1 and three free ports (clients, admin,
        metrics)."""
        script = Path(sys.executable).with_name("pd-proxy")
        assert script.is_file(), f"{script} is not installed (make install)"
        port, admin, metrics = (pick_port(HOST) for _ in range(3))
        return cls([str(script), "--membership", str(membership), "--host", HOST, "--port", str(port),
                    "--admin-port", str(admin), "--metrics-port", str(metrics), "--poll-interval", "0.2",
                    *extra], HOST, port, log, admin, env=env, preexec_fn=preexec_fn, metrics_port=metrics)

    async def start(self) -> ProxyProcess:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         preexec_fn=self.preexec_fn)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        await until("pd-proxy to listen", self._listening)
        return self

    async def stop(self) -> None:
        """SIGTERM, SIGKILL after 30 s."""
        await self._session.close()
        assert self.proc is not None
        self.proc.terminate()
        try:
            await asyncio.to_thread(self.proc.wait, 30)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: connections reset, requests in flight cut."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    async def __aenter__(self) -> ProxyProcess:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        if exc[0] is not None:
            print(f"--- pd-proxy log ({self.log}) ---\n{self.log.read_text()[-20000:]}")

    def _listening(self) -> bool:
        """Every port accepts: the clients', the admin one and the metrics one (pd-proxy starts them
        one after the other)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"pd-proxy exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
        for port in (self.port, self.admin_port, self.metrics_port):
            if port is None:
                continue
            try:
                with socket.create_connection((self.host, port), timeout=1):
                    pass
            except OSError:
                return False
        return True

    async def get(self, path: str, admin: bool = False) -> tuple[int, Any]:
        """On the clients' port, or the admin port (with the admin token its environment gives it)."""
        token = (self.env or {}).get(ADMIN_TOKEN_ENV) if admin else None
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with self._session.get((self.admin_url if admin else self.url) + path, headers=headers) as resp:
            return resp.status, await resp.json()

    async def post(self, path: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        async with self._session.post(self.url + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json()

    async def state(self) -> ProxyState:
        status, body = await self.get(STATE_PATH, admin=True)
        assert status == 200, body
        return parse_state(body)

    async def wait_state(self, what: str, check: Callable[[ProxyState], bool]) -> ProxyState:
        """Poll /pd/state until `check` holds; that state."""
        deadline = time.monotonic() + WAIT_S
        while True:
            state = await self.state()
            if check(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; last /pd/state: {state}")
            await asyncio.sleep(0.02)

    async def wait_version(self, version: str) -> ProxyState:
        return await self.wait_state(f"membership version {version}", lambda s: s.version == version)


def load_of(state: ProxyState, name: str) -> tuple[int, int]:
    """(inflight, awaitingDecode) of an upstream; a name the proxy dropped carries nothing."""
    load = state.upstreams.get(name)
    return (load.inflight, load.awaiting_decode) if load else (0, 0)

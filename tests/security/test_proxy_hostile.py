"""The real `pd-proxy` process facing hostile clients (issue 26): what a client sends or withholds
never grows the proxy without bound, never reaches an engine it should not, and never keeps a
normal request from being served.

Each case runs its own proxy process with small bounds (pd_operator.proxy.options) in front of
fake engines on loopback (support/fakevllm.py), and drives it with raw sockets where a well-behaved
HTTP client could not misbehave. Memory is the kernel's figure for the proxy process
(/proc/<pid>/status: VmHWM, the peak resident set), read after the attack; every wait has a
deadline for waiting only, and outcomes are asserted, never durations.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from pd_operator.controller.proxy_state import ProxyStateReader, ProxyUnreachable
from pd_operator.proxy.membership import STATE_PATH, Upstream, document
from pd_operator.proxy.options import ADMIN_TOKEN_ENV, API_KEY_ENV
from pd_operator.render import proxy as rendered_proxy
from support.fakevllm import (
    HOST,
    MODEL,
    WAIT_S,
    Canned,
    FakeEngine,
    ProxyProcess,
    check_answer,
    load_of,
    started,
    swap,
    until,
)
from support.specs import example, resolve

pytestmark = pytest.mark.security

MiB = 1 << 20
BODY_LIMIT = 1 * MiB
BUDGET = 16 * MiB
"""--max-buffered-bytes of the memory cases."""
LARGE_ROOM = BUDGET - BUDGET // 4
"""What bodies over BUDGET / 64 may fill of it (the rest is for ordinary requests): at most 12
bodies of about BODY_LIMIT at once."""
RSS_BOUND = 100 * MiB
"""What an attack may add to the proxy's peak resident set over its size once serving: the
buffered bodies (BUDGET) about three times over (api/types.py ProxyLimits.max_buffered_bytes) and
the connections' buffers. Unbounded, 200 bodies of 1 MiB held at once cost about 3 bytes each
(issue 26: 500 stalled uploads took the proxy from 51 to 663 MB)."""
NORMAL = {"model": MODEL, "prompt": "hello", "max_tokens": 16}


def rss(pid: int, field: str = "VmRSS") -> int:
    """Bytes, from /proc/<pid>/status (VmRSS now, VmHWM the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


@asynccontextmanager
async def proxied(tmp_path: Path, *options: str, prefill: FakeEngine | None = None,
                  decode: FakeEngine | None = None, env: dict[str, str] | None = None,
                  preexec_fn=None) -> AsyncIterator[tuple[ProxyProcess, FakeEngine, FakeEngine]]:
    p0, d0 = await started(prefill or FakeEngine("glm-flash-prefill-0", "prefill"),
                           decode or FakeEngine("glm-flash-decode-0", "decode"))
    membership = tmp_path / "upstreams.json"
    version = swap(membership, document([p0.upstream], [d0.upstream]))
    try:
        async with ProxyProcess.on_loopback(membership, tmp_path / "proxy.log", "--retry-delay", "0",
                                            *options, env=env, preexec_fn=preexec_fn) as proxy:
            await proxy.wait_version(version)
            yield proxy, p0, d0
    finally:
        await asyncio.gather(p0.stop(), d0.stop())


async def normal_request(proxy: ProxyProcess, headers: dict[str, str] | None = None, chunks: int = 4) -> None:
    """A client's ordinary request is answered whole (decode answers `chunks` tokens)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client, \
            client.post(proxy.url + "/v1/completions", json=NORMAL, headers=headers) as resp:
        raw = await resp.read()
        problem = check_answer(resp.status, raw, chat=False, stream=False, usage=False, chunks=chunks)
        assert problem is None, problem[:300]


def head(path: str, length: int | None, content_type: str = "application/json", extra: str = "") -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {HOST}", f"Content-Type: {content_type}"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


async def answer_or_eof(reader: asyncio.StreamReader) -> bytes:
    """What the proxy sent before closing the connection (b"": it closed without a word)."""
    return await asyncio.wait_for(reader.read(), WAIT_S)


def status_of(raw: bytes) -> int | None:
    return int(raw.split(b" ", 2)[1]) if raw.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")) else None


# --- memory ------------------------------------------------------------------------------------------


async def _stalled_uploads(tmp_path: Path) -> None:
    uploads = 200
    async with proxied(tmp_path, "--max-body-bytes", str(BODY_LIMIT), "--max-buffered-bytes", str(BUDGET),
                       "--body-timeout", "600", "--header-timeout", "300") as (proxy, p0, d0):
        pid = proxy.proc.pid
        await normal_request(proxy)
        serving = rss(pid)
        conns = [await asyncio.open_connection(HOST, proxy.port) for _ in range(uploads)]
        short = b"x" * (BODY_LIMIT - 1)  # one byte short: the body never completes

        async def send(writer: asyncio.StreamWriter) -> None:
            try:
                writer.write(head("/v1/completions", BODY_LIMIT) + short)
                await writer.drain()
            except OSError:
                pass  # refused and closed before all of it went out

        await asyncio.gather(*(send(w) for _, w in conns))
        # The bodies the budget admits stay held; every other upload is answered 503 and closed.
        answers: dict[int, bytes] = {}

        async def closed(i: int, reader: asyncio.StreamReader) -> None:
            try:
                answers[i] = await reader.read()
            except ConnectionResetError:
                answers[i] = b""  # closed with our upload unread: the kernel sent a reset, not the 503

        readers = [asyncio.create_task(closed(i, r)) for i, (r, _) in enumerate(conns)]
        await until("every upload past the budget to be refused",
                    lambda: len(answers) >= uploads - LARGE_ROOM // BODY_LIMIT)
        await normal_request(proxy)  # served while the budget is held by stalled uploads
        peak = rss(pid, "VmHWM")
        held = uploads - len(answers)
        for task in readers:
            task.cancel()
        for _, writer in conns:
            writer.close()
    statuses = {status_of(a) for a in answers.values()}
    assert statuses <= {503, None}, statuses  # None: reset while the body was still going out
    assert any(b"Retry-After: 1" in a for a in answers.values())
    assert 0 < held <= LARGE_ROOM // BODY_LIMIT, held
    assert peak - serving < RSS_BOUND, f"peak {peak / MiB:.0f} MiB, {serving / MiB:.0f} MiB serving"
    print(f"stalled uploads: {uploads}, held {held}, refused {len(answers)}; proxy RSS "
          f"{serving / MiB:.0f} MiB serving, peak {peak / MiB:.0f} MiB")


def test_stalled_uploads_hold_no_more_than_the_body_budget(tmp_path):
    asyncio.run(_stalled_uploads(tmp_path))


async def _large_bodies(tmp_path: Path) -> None:
    clients = 200
    prompt = "y" * (BODY_LIMIT - 64 * 1024)
    large = json.dumps({**NORMAL, "prompt": prompt}).encode()
    fits = LARGE_ROOM // len(large)
    decode = FakeEngine("glm-flash-decode-0", "decode")
    holding = decode.hold("answer", limit=clients, match=lambda body: len(body["prompt"]) > 1000)
    async with proxied(tmp_path, "--max-body-bytes", str(BODY_LIMIT), "--max-buffered-bytes", str(BUDGET),
                       decode=decode) as (proxy, p0, d0):
        pid = proxy.proc.pid
        await normal_request(proxy)
        serving = rss(pid)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S * 2)) as client:
            async def ask() -> tuple[int, str | None, bytes]:
                async with client.post(proxy.url + "/v1/completions", data=large,
                                       headers={"Content-Type": "application/json"}) as resp:
                    return resp.status, resp.headers.get("Retry-After"), await resp.read()

            asking = [asyncio.create_task(ask()) for _ in range(clients)]
            await until("the refused ones to be answered",
                        lambda: sum(t.done() for t in asking) >= clients - fits)
            await holding.caught_at_least(1)
            await normal_request(proxy)  # a small body still fits beside the held ones
            peak = rss(pid, "VmHWM")
            held = holding.waiting
            holding.release()
            answers = await asyncio.gather(*asking)
    ok = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 503]
    assert len(ok) + len(refused) == clients, {a[0] for a in answers}
    assert all(retry == "1" for _, retry, _ in refused)
    assert 0 < len(ok) <= fits and held <= fits, (len(ok), held, fits)
    assert all(check_answer(200, raw, chat=False, stream=False, usage=False, chunks=4) is None
               for _, _, raw in ok)
    assert peak - serving < RSS_BOUND, f"peak {peak / MiB:.0f} MiB, {serving / MiB:.0f} MiB serving"
    assert p0.errors == d0.errors == []
    print(f"large bodies: {clients} x {len(large) / MiB:.2f} MiB, {len(ok)} served, {len(refused)} refused "
          f"503; proxy RSS {serving / MiB:.0f} MiB serving, peak {peak / MiB:.0f} MiB")


def test_concurrent_large_bodies_past_the_budget_are_refused_not_buffered(tmp_path):
    asyncio.run(_large_bodies(tmp_path))


# --- connections -------------------------------------------------------------------------------------


async def _slowloris(tmp_path: Path) -> None:
    async with proxied(tmp_path, "--header-timeout", "2") as (proxy, p0, d0):
        half = [await asyncio.open_connection(HOST, proxy.port) for _ in range(100)]
        for _, writer in half:  # a request line and one header, never the blank line
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        # A kept-alive connection that answered a request, then sends half of the next one.
        reader, writer = await asyncio.open_connection(HOST, proxy.port)
        body = json.dumps(NORMAL).encode()
        writer.write(head("/v1/completions", len(body)) + body)
        first = await reader.readuntil(b"\r\n\r\n")
        assert status_of(first) == 200
        length = int(next(line.split(b":")[1] for line in first.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        writer.write(b"POST /v1/completions HTTP/1.1\r\n")
        half.append((reader, writer))
        await normal_request(proxy)  # served while they are open
        left = await asyncio.gather(*(answer_or_eof(r) for r, _ in half))
        for _, writer in half:
            writer.close()
    assert left == [b""] * len(half)  # each was closed by the proxy, without an answer


def test_half_sent_requests_are_closed_at_the_header_timeout(tmp_path):
    asyncio.run(_slowloris(tmp_path))


async def _excess(tmp_path: Path) -> None:
    cap = 4
    decode = FakeEngine("glm-flash-decode-0", "decode")
    holding = decode.hold("answer", limit=cap)
    async with proxied(tmp_path, "--max-concurrent-requests", str(cap), decode=decode) as (proxy, p0, d0), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client:
        async def ask() -> tuple[int, str | None]:
            async with client.post(proxy.url + "/v1/completions", json=NORMAL) as resp:
                await resp.read()
                return resp.status, resp.headers.get("Retry-After")

        served = [asyncio.create_task(ask()) for _ in range(cap)]
        await holding.caught_at_least(cap)
        excess = await asyncio.gather(*(ask() for _ in range(20)))
        assert holding.waiting == cap  # refused while the first ones were still held, not queued
        holding.release()
        assert await asyncio.gather(*served) == [(200, None)] * cap
        await normal_request(proxy)
    assert excess == [(503, "1")] * 20


def test_requests_past_the_cap_are_refused_with_retry_after_not_queued(tmp_path):
    asyncio.run(_excess(tmp_path))


OPEN_FILES = 300


def _low_open_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


async def _fd_exhaustion(tmp_path: Path) -> None:
    idle = OPEN_FILES + 20
    async with proxied(tmp_path, "--header-timeout", "300", preexec_fn=_low_open_file_limit) \
            as (proxy, p0, d0):
        conns = []
        for _ in range(idle):
            reader, writer = await asyncio.open_connection(HOST, proxy.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\n")
            conns.append((reader, writer))
        await normal_request(proxy)
        await normal_request(proxy)
        open_files = len(os.listdir(f"/proc/{proxy.proc.pid}/fd"))
        closed = (await asyncio.gather(*(_closed_now(r) for r, _ in conns))).count(True)
        for _, writer in conns:
            writer.close()
        log = proxy.log.read_text()
    assert open_files < OPEN_FILES
    assert closed >= idle - (OPEN_FILES - 64), closed  # the oldest idle ones made room
    assert "Too many open files" not in log and "out of system resource" not in log
    assert len(log.splitlines()) < 20, log[-3000:]  # no line per connection


async def _closed_now(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 0.5) == b""
    except TimeoutError:
        return False


def test_idle_connections_past_the_open_file_limit_do_not_stop_a_request(tmp_path):
    asyncio.run(_fd_exhaustion(tmp_path))


# --- upstream bounds ---------------------------------------------------------------------------------


async def _hung_decode(tmp_path: Path) -> None:
    decode = FakeEngine("glm-flash-decode-0", "decode")
    hung = decode.hold("answer", limit=2)  # a stream's headers go out, then nothing
    async with proxied(tmp_path, "--idle-timeout", "1", "--max-prefills", "2", decode=decode) \
            as (proxy, p0, d0):
        status, answer = await proxy.post("/v1/completions", {**NORMAL, "stream": True})
        assert hung.caught == 2  # both decodes hung: neither was released before the client's answer
        hung.release()
        state = await proxy.wait_state("nothing in flight", lambda s: load_of(s, d0.name) == (0, 0))
    assert status == 504 and answer["error"]["type"] == "upstream_timeout", answer
    assert len(p0.received) == 2 and len(d0.received) == 2  # --max-prefills, not more
    assert load_of(state, p0.name) == (0, 0)


def test_a_hung_decode_gets_504_after_the_idle_timeout(tmp_path):
    asyncio.run(_hung_decode(tmp_path))


async def _unread_stream(tmp_path: Path) -> None:
    decode = FakeEngine("glm-flash-decode-0", "decode", chunks=200_000)
    async with proxied(tmp_path, "--idle-timeout", "1", decode=decode) as (proxy, p0, d0):
        reader, writer = await asyncio.open_connection(HOST, proxy.port)
        body = json.dumps({**NORMAL, "stream": True}).encode()
        writer.write(head("/v1/completions", len(body)) + body)
        assert status_of(await reader.readuntil(b"\r\n\r\n")) == 200
        # Decode got the call (its own record: the proxy's inflight count of 1 can be over before a
        # poll sees it on a loaded machine, since the idle timeout is 1 s).
        await until("decode to get the request", lambda: d0.received)
        # The client reads no more; once the buffers between are full, the proxy closes the stream.
        await proxy.wait_state("decode's call to end", lambda s: load_of(s, d0.name) == (0, 0))
        await normal_request(proxy, chunks=decode.chunks)
        writer.close()
    assert "read nothing of its stream" in proxy.log.read_text()


def test_a_client_that_stops_reading_its_stream_does_not_hold_decode(tmp_path):
    asyncio.run(_unread_stream(tmp_path))


# --- what reaches the engines ------------------------------------------------------------------------


async def _client_kv_params(tmp_path: Path) -> None:
    theirs = {"do_remote_prefill": True, "remote_host": "169.254.169.254", "remote_port": 80,
              "remote_engine_id": "glm-flash-prefill-9", "remote_block_ids": [[666]],
              "remote_request_id": "someone-else"}
    async with proxied(tmp_path) as (proxy, p0, d0):
        for stream in (False, True):
            status, _ = await proxy.post("/v1/completions", {**NORMAL, "stream": stream,
                                                             "kv_transfer_params": theirs}) \
                if not stream else (await _stream_status(proxy, {**NORMAL, "stream": True,
                                                                 "kv_transfer_params": theirs}), None)
            assert status == 200
    sent = [r.body["kv_transfer_params"] for r in d0.received]
    assert len(sent) == 2
    assert all(p["remote_engine_id"] == p0.name and p["remote_host"] == p0.host
               and p["remote_port"] == p0.port for p in sent), sent
    assert all(r.body["kv_transfer_params"]["do_remote_decode"] for r in p0.received)


async def _stream_status(proxy: ProxyProcess, body: dict) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client, \
            client.post(proxy.url + "/v1/completions", json=body) as resp:
        await resp.read()
        return resp.status


def test_a_clients_kv_transfer_params_never_reach_decode(tmp_path):
    asyncio.run(_client_kv_params(tmp_path))


async def _prefill_without_kv(tmp_path: Path) -> None:
    no_kv = Canned(200, json.dumps({"id": "x", "object": "text_completion", "choices": [
        {"index": 0, "text": "x", "finish_reason": "length"}]}).encode())
    prefill = FakeEngine("glm-flash-prefill-0", "prefill", canned=no_kv)
    async with proxied(tmp_path, prefill=prefill) as (proxy, p0, d0):
        status, answer = await proxy.post("/v1/completions", {
            **NORMAL, "kv_transfer_params": {"remote_host": "169.254.169.254"}})
    assert status == 502 and answer["error"]["type"] == "upstream_error", answer
    assert p0.received and d0.received == []


def test_a_prefill_answer_without_kv_params_is_an_upstream_error(tmp_path):
    asyncio.run(_prefill_without_kv(tmp_path))


# --- separation and authentication -------------------------------------------------------------------


async def _admin_port(tmp_path: Path) -> None:
    async with proxied(tmp_path) as (proxy, p0, d0), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client:
        user = []
        for method, path in (("GET", STATE_PATH), ("POST", "/reset_prefix_cache"),
                             ("POST", "/reset_prefix_cache?reset_running_requests=true")):
            async with client.request(method, proxy.url + path) as resp:
                user.append((resp.status, await resp.read()))
        async with client.get(proxy.admin_url + STATE_PATH) as resp:
            admin = resp.status, await resp.json()
        for path in ("/v1/completions", "/v1/models"):
            async with client.post(proxy.admin_url + path, json=NORMAL) as resp:
                user.append((resp.status, await resp.read()))
    assert all(status == 404 for status, _ in user), user
    assert not any(b"upstreams" in body for _, body in user)
    assert admin[0] == 200 and set(admin[1]["upstreams"]) == {p0.name, d0.name}
    assert p0.received == d0.received == []


def test_admin_endpoints_are_not_on_the_clients_port(tmp_path):
    asyncio.run(_admin_port(tmp_path))


async def _api_key(tmp_path: Path) -> None:
    key = "s3cret-key-0123456789"
    env = {**os.environ, API_KEY_ENV: key}
    async with proxied(tmp_path, env=env) as (proxy, p0, d0), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client:
        refused = []
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {key}"},
                        {"Authorization": f"Bearer {key}x"}, {"Authorization": key}):
            for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                 ("GET", "/v1/models"), ("GET", STATE_PATH)):
                async with client.request(method, proxy.url + path, json=NORMAL, headers=headers) as resp:
                    refused.append((resp.status, resp.headers.get("WWW-Authenticate")))
        await normal_request(proxy, {"Authorization": f"Bearer {key}"})
        async with client.get(proxy.url + "/v1/models", headers={"Authorization": f"bearer {key}"}) as resp:
            models = resp.status
        async with client.get(proxy.url + "/healthcheck") as resp:  # the readiness probe has no key
            health = resp.status
    assert set(refused) == {(401, "Bearer")}, refused
    assert models == 200 and health == 200
    assert [r.authorization for r in p0.received + d0.received] == [f"Bearer {key}"] * 2


def test_without_a_valid_key_every_serving_path_answers_401(tmp_path):
    asyncio.run(_api_key(tmp_path))


CLUSTER_DNS = "glm-flash-{role}-0-0.glm-flash-{role}-0.tenant-a.svc.cluster.local"


async def _no_dns_names(tmp_path: Path) -> None:
    p0, d0 = await started(FakeEngine("glm-flash-prefill-0", "prefill"),
                           FakeEngine("glm-flash-decode-0", "decode"))
    membership = tmp_path / "upstreams.json"
    bodies = []
    try:
        for prefill, decode in (
                (Upstream("glm-flash-prefill-1", f"http://{CLUSTER_DNS.format(role='prefill')}:8000"),
                 d0.upstream),
                (p0.upstream, Upstream("glm-flash-decode-1", f"http://{CLUSTER_DNS.format(role='decode')}:8000"))):
            version = swap(membership, document([prefill], [decode]))
            log = tmp_path / f"proxy-{version}.log"
            async with ProxyProcess.on_loopback(membership, log, "--retry-delay", "0") as proxy, \
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client:
                await proxy.wait_version(version)
                for stream in (False, True):
                    async with client.post(proxy.url + "/v1/completions", json={**NORMAL, "stream": stream}) \
                            as resp:
                        bodies.append((resp.status, await resp.read()))
                if decode is d0.upstream:
                    async with client.get(proxy.url + "/v1/models") as resp:
                        bodies.append((resp.status, await resp.read()))
                logged = proxy.log.read_text()
                assert "svc.cluster.local" in logged  # the detail is in the log
    finally:
        await asyncio.gather(p0.stop(), d0.stop())
    assert {status for status, _ in bodies} <= {502, 503}, bodies
    for _, body in bodies:
        assert b"svc" not in body and b"tenant-a" not in body, body
        assert b"glm-flash-prefill-1" in body or b"glm-flash-decode-1" in body, body


def test_no_error_body_names_a_cluster_dns_name(tmp_path):
    asyncio.run(_no_dns_names(tmp_path))


# --- malformed requests ------------------------------------------------------------------------------


async def _malformed(tmp_path: Path) -> None:
    cases = {
        "deeply nested arrays": ("application/json", b"[" * 200_000 + b"]" * 200_000),
        "deeply nested objects": ("application/json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
        "a JSON array": ("application/json", b"[1, 2]"),
        "a JSON string": ("application/json", b'"hello"'),
        "not JSON": ("application/json", b"{model: x"),
        "not UTF-8": ("application/json", b'{"prompt": "\xff\xfe"}'),
        "empty": ("application/json", b""),
        "plain text": ("text/plain", json.dumps(NORMAL).encode()),
        "a form": ("application/x-www-form-urlencoded", b"model=x&prompt=y"),
        "multipart": ("multipart/form-data; boundary=x", b"--x--"),
        "over the limit": ("application/json", b" " * (BODY_LIMIT + 1)),
    }
    async with proxied(tmp_path, "--max-body-bytes", str(BODY_LIMIT)) as (proxy, p0, d0), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client:
        got = {}
        for name, (content_type, data) in cases.items():
            async with client.post(proxy.url + "/v1/chat/completions", data=data,
                                   headers={"Content-Type": content_type}) as resp:
                got[name] = resp.status, await resp.read()
        # ("r" * 4000: within the 4 KiB header line; a longer one is refused by the header limits)
        for name, request_id in (("long X-Request-Id", "r" * 4000), ("X-Request-Id with a newline", "a\tb"),
                                 ("X-Request-Id with quotes", 'a"b'),
                                 ("X-Request-Id with a slash", "a/../b")):
            async with client.post(proxy.url + "/v1/completions", json=NORMAL,
                                   headers={"X-Request-Id": request_id}) as resp:
                got[name] = resp.status, await resp.read()
        await normal_request(proxy)
        await normal_request(proxy, {"X-Request-Id": "req-1:a.b_c-D9"})
    statuses = {name: status for name, (status, _) in got.items()}
    assert all(400 <= s < 500 for s in statuses.values()), statuses
    assert statuses["plain text"] == statuses["a form"] == statuses["multipart"] == 415
    assert statuses["over the limit"] == 413
    assert all(json.loads(body)["error"]["type"] == "invalid_request_error" for _, body in got.values())
    assert "Traceback" not in proxy.log.read_text()
    assert len(p0.received) == len(d0.received) == 2  # only the normal requests went on


def test_malformed_requests_get_a_4xx(tmp_path):
    asyncio.run(_malformed(tmp_path))


# --- before authentication (issue 34) ----------------------------------------------------------------

KEY = "s3cret-key-0123456789"
KEYED = {**os.environ, API_KEY_ENV: KEY}
AUTHORIZED = {"Authorization": f"Bearer {KEY}"}
ELSEWHERE = "127.0.9.9"
"""Another client's address (the whole of 127.0.0.0/8 is loopback on Linux)."""
PAD_LINES, PAD_BYTES = 31, 4000
"""Header lines a connection may send before the proxy's limits (32 lines of at most 4 KiB) refuse it."""


def padded_head(lines: int = PAD_LINES, size: int = PAD_BYTES) -> bytes:
    """A request line and `lines` header lines of `size` bytes, without the blank line that ends them."""
    line = b"X-Pad-%02d: " + b"p" * (size - 12) + b"\r\n"
    request = f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\n".encode()
    return request + b"".join(line % i for i in range(lines))


async def from_elsewhere(proxy: ProxyProcess, source: str = ELSEWHERE) -> None:
    """An authenticated request from another address, answered whole."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
    timeout = aiohttp.ClientTimeout(total=WAIT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client, \
            client.post(proxy.url + "/v1/completions", json=NORMAL, headers=AUTHORIZED) as resp:
        raw = await resp.read()
    problem = check_answer(resp.status, raw, chat=False, stream=False, usage=False, chunks=4)
    assert problem is None, problem[:300]


async def hold_heads(port: int, count: int, sources: int, head: bytes) -> list[tuple[asyncio.StreamReader,
                                                                                 asyncio.StreamWriter]]:
    out = []
    for i in range(count):
        source = (f"127.0.{1 + i % sources}.1", 0)
        reader, writer = await asyncio.open_connection(HOST, port, local_addr=source)
        try:
            writer.write(head)
            await writer.drain()
        except OSError:
            pass  # refused and closed: the proxy's bound
        out.append((reader, writer))
    return out


async def _header_flood(tmp_path: Path) -> None:
    cap = 64
    async with proxied(tmp_path, "--max-client-connections", str(cap), env=KEYED) as (proxy, p0, d0):
        pid = proxy.proc.pid
        await from_elsewhere(proxy)
        serving = rss(pid)
        # Twice the cap, from 8 addresses, each holding as much unfinished header as the limits let.
        held = await hold_heads(proxy.port, 2 * cap, 8, padded_head())
        await from_elsewhere(proxy)  # a new connection closes the oldest half-sent one
        peak = rss(pid, "VmHWM")
        closed = (await asyncio.gather(*(_closed_now(r) for r, _ in held))).count(True)
        for _, writer in held:
            writer.close()
    assert closed >= cap, closed  # past the cap the oldest were closed
    # At most `cap` connections of about 124 KB of headers each, with the parser's copies.
    bound = cap * PAD_LINES * PAD_BYTES * 4 + 32 * MiB
    assert peak - serving < bound, f"peak {peak / MiB:.0f} MiB, {serving / MiB:.0f} MiB serving"


def test_a_flood_of_unfinished_headers_is_bounded_by_the_connection_cap(tmp_path):
    asyncio.run(_header_flood(tmp_path))


async def _header_limits(tmp_path: Path) -> None:
    async with proxied(tmp_path, env=KEYED) as (proxy, p0, d0):
        answers = {}
        # aiohttp's own limits allow 128 lines of 8 KB.
        for name, head in (("a 33rd header line", padded_head(33, 100)),
                           ("a header line over 4 KiB", padded_head(1, 5000))):
            reader, writer = await asyncio.open_connection(HOST, proxy.port)
            try:
                writer.write(head)
                await writer.drain()
            except OSError:
                pass
            answers[name] = await answer_or_eof(reader)
            writer.close()
        await from_elsewhere(proxy)
    assert {name: status_of(raw) for name, raw in answers.items()} == dict.fromkeys(answers, 400), answers
    assert len(p0.received) == 1  # only the authenticated request reached an engine


def test_headers_past_the_limits_get_400_before_the_key_is_checked(tmp_path):
    asyncio.run(_header_limits(tmp_path))


async def _per_source(tmp_path: Path) -> None:
    per_source = 8
    async with proxied(tmp_path, "--max-connections-per-source", str(per_source), env=KEYED) \
            as (proxy, p0, d0):
        held = await hold_heads(proxy.port, per_source, 1, padded_head(2, 100))
        # Past its share: refused before anything is read (they send nothing, so the answer is not
        # lost to a reset of unread bytes).
        held += await hold_heads(proxy.port, 2 * per_source, 1, b"")
        refused = [status_of(await answer_or_eof(r)) for r, _ in held[per_source:]]
        await from_elsewhere(proxy)
        open_ones = (await asyncio.gather(*(_closed_now(r) for r, _ in held[:per_source]))).count(False)
        for _, writer in held:
            writer.close()
    assert refused == [503] * (2 * per_source), refused
    assert open_ones == per_source  # the first ones stay: refusing is per address, not a global eviction


def test_one_address_cannot_take_more_than_its_share_of_connections(tmp_path):
    asyncio.run(_per_source(tmp_path))


async def _dripping_headers(tmp_path: Path) -> None:
    async with proxied(tmp_path, "--header-timeout", "2", env=KEYED) as (proxy, p0, d0):
        reader, writer = await asyncio.open_connection(HOST, proxy.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\n")
        sent = 0
        closed = False
        for _ in range(400):  # a byte every 0.1 s, well inside any read timeout, for up to 40 s
            try:
                writer.write(b"X-Drip-%d: x\r\n" % sent)
                await writer.drain()
            except OSError:
                closed = True
                break
            sent += 1
            if await _closed_now_within(reader, 0.1):
                closed = True
                break
        writer.close()
        await from_elsewhere(proxy)
    assert closed, "a connection dripping header lines was never closed"
    assert sent < 40, sent  # closed at the header timeout, not by the header count limit


async def _closed_now_within(reader: asyncio.StreamReader, wait: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), wait) == b""
    except TimeoutError:
        return False


def test_headers_dripped_line_by_line_are_closed_at_the_header_timeout(tmp_path):
    asyncio.run(_dripping_headers(tmp_path))


async def _logs(tmp_path: Path) -> None:
    async with proxied(tmp_path, env=KEYED) as (proxy, p0, d0):
        for raw in (b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode()
                    + b"\r\nX-Bad\x01Header: leak-me\r\n\r\n",
                    b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode()
                    + b"\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nleak-me-body",
                    b"GET /\x00leak-me HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n"):
            reader, writer = await asyncio.open_connection(HOST, proxy.port)
            writer.write(raw)
            assert status_of(await answer_or_eof(reader)) == 400
            writer.close()
        await from_elsewhere(proxy)
        log = proxy.log.read_text()
    assert KEY not in log and "leak-me" not in log, log[-3000:]
    assert "Error handling request from 127.0.0.1: BadHttpMessage" in log  # said, without what was sent


def test_malformed_requests_are_logged_without_their_headers_or_bodies(tmp_path):
    asyncio.run(_logs(tmp_path))


# --- the membership (issue 34) -----------------------------------------------------------------------


async def _membership(tmp_path: Path) -> None:
    ctx = resolve(example())
    spec = ctx.deployment.spec
    good = rendered_proxy.membership_document(ctx)
    smaller = rendered_proxy.membership_document(ctx, {"prefill": {0: ctx.layout_hash},
                                                       "decode": {0: ctx.layout_hash}})
    attacker = FakeEngine("glm-flash-decode-0", "decode")
    await attacker.start()
    forged = document([Upstream(u["name"], u["url"], u.get("layout", "")) for u in good["prefill"]],
                      [attacker.upstream])
    path = tmp_path / "upstreams.json"
    version = swap(path, good)
    try:
        async with ProxyProcess.on_loopback(path, tmp_path / "proxy.log", "--deployment", ctx.deployment.name,
                                            "--namespace", ctx.deployment.namespace, "--serving-port",
                                            str(spec.serving_port)) as proxy:
            await proxy.wait_version(version)
            for bad in (json.dumps(forged), "[" * 100_000 + "]" * 100_000):
                before = proxy.log.read_text().count("is malformed")
                path.write_text(bad)
                await until("the proxy to read the bad membership",
                            lambda b=before: proxy.log.read_text().count("is malformed") > b)
                assert (await proxy.state()).version == version
            await proxy.post("/v1/completions", NORMAL)  # routed by the good one: not to the attacker
            later = swap(path, smaller)
            await proxy.wait_version(later)
    finally:
        await attacker.stop()
    assert attacker.received == []
    assert str(forged["version"]) != later


def test_membership_entries_outside_the_deployments_addresses_are_refused(tmp_path):
    asyncio.run(_membership(tmp_path))


# --- the admin port's own token (issue 34) -----------------------------------------------------------


async def _admin_token(tmp_path: Path) -> None:
    token = "admin-token-0123456789"
    env = {**KEYED, ADMIN_TOKEN_ENV: token}
    async with proxied(tmp_path, env=env) as (proxy, p0, d0), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client:
        refused = []
        for headers in ({}, AUTHORIZED, {"Authorization": f"Bearer {token}x"}, {"Authorization": token}):
            for method, path in (("GET", STATE_PATH), ("POST", "/reset_prefix_cache"),
                                 ("GET", "/healthcheck")):
                async with client.request(method, proxy.admin_url + path, headers=headers) as resp:
                    refused.append(resp.status)
        reader = ProxyStateReader()
        state = await asyncio.to_thread(reader.read, HOST, proxy.admin_port, token)
        try:
            await asyncio.to_thread(reader.read, HOST, proxy.admin_port)
            keyless = None
        except ProxyUnreachable as err:
            keyless = str(err)
    assert set(refused) == {401}, refused  # the clients' API key is not the admin token
    assert set(state.upstreams) == {p0.name, d0.name}
    assert keyless == "HTTP 401"
    assert p0.received == d0.received == []  # no reset reached an engine


def test_the_admin_port_wants_its_own_token(tmp_path):
    asyncio.run(_admin_token(tmp_path))

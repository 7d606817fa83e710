"""pd-proxy's memory under a flood of unfinished headers (issue 34): connections that each send a
request line and as many header lines as the proxy's limits let through (31 lines of 4000 bytes,
about 124 KB; the 32nd would get a 400 and the connection closed) and never the blank line, from
several addresses, while a client from another address sends authenticated requests. The proxy
runs with the defaults it is rendered with (api/types.py ProxyLimits) and an API key, in front of
fake engines (tests/support/fakevllm.py). Before issue 34 aiohttp's own limits let each connection
hold about 1 MB (128 lines of 8 KB): 550 such connections took the proxy from 51 to 1135 MiB.

Two floods, one after the other: 550 connections (the issue's), then twice the client-connection
cap (2048, from 16 addresses: past the cap each new connection closes the oldest half-sent one).
Memory is the kernel's figure for the proxy process (VmHWM, its peak resident set); the baseline is
its size once serving, measured in the same run. Every figure is a measurement, not a judgement.

Figures:
- flood_serving_rss_mb: the proxy's resident set once serving, before any flood (the baseline)
- flood_550_peak_rss_mb: its peak during the flood of 550 connections
- flood_twice_cap_peak_rss_mb: its peak during the flood of twice the client-connection cap
- flood_peak_of_memory_limit: the higher peak over the memory limit the proxy is rendered with
  (1 GiB; goal below 0.8)
- flood_peak_vs_serving_ratio: the higher peak over the baseline
- flood_authenticated_ok: authenticated requests from another address answered whole during the floods
- flood_authenticated_failed: those that were not (goal 0)

`--quick`: 64 and 128 connections against a cap of 64.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import tempfile
from pathlib import Path

import _paths  # noqa: F401  (tests/ on sys.path)
import aiohttp

from pd_operator.api.types import ProxyLimits
from pd_operator.proxy.membership import document
from pd_operator.proxy.options import API_KEY_ENV
from pd_operator.render.proxy import DEFAULT_LIMITS
from support import bench
from support.fakevllm import HOST, MODEL, FakeEngine, ProxyProcess, check_answer, started, swap

MiB = 1 << 20
KEY = "flood-bench-key-0123456789"
LINES, LINE_BYTES = 31, 4000
FIRST_FLOOD = 550
SOURCES = 16
REQUESTER = "127.0.9.9"
REQUEST = {"model": MODEL, "prompt": "hello", "max_tokens": 16}


def gibibytes(quantity: str) -> int:
    units = {"Gi": 1 << 30, "Mi": 1 << 20}
    return int(float(quantity[:-2]) * units[quantity[-2:]])


def peak(pid: int, field: str = "VmHWM") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for {pid}")


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (Linux: writing 5 to clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def flood(port: int, count: int, sources: int) -> list[asyncio.StreamWriter]:
    """`count` connections, spread over `sources` loopback addresses, each holding unfinished headers."""
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\n".encode()
    line = b"X-Pad-%02d: " + b"p" * (LINE_BYTES - 12) + b"\r\n"
    writers = []
    for i in range(count):
        try:
            source = (f"127.0.{1 + i % sources}.1", 0)
            _, writer = await asyncio.open_connection(HOST, port, local_addr=source)
            writer.write(head + b"".join(line % n for n in range(LINES)))
            await writer.drain()
        except OSError:
            continue  # refused or closed by the proxy: its bound, not the bench's failure
        writers.append(writer)
    return writers


async def ask(client: aiohttp.ClientSession, url: str) -> str | None:
    """One authenticated request; None when answered whole, else what went wrong."""
    try:
        async with client.post(url + "/v1/completions", json=REQUEST,
                               headers={"Authorization": f"Bearer {KEY}"}) as resp:
            raw = await resp.read()
            return check_answer(resp.status, raw, chat=False, stream=False, usage=False, chunks=4)
    except (aiohttp.ClientError, TimeoutError) as err:
        return f"{type(err).__name__}: {err}"


async def run(floods: list[tuple[int, int]], cap: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="pd-flood-") as tmp:
        work = Path(tmp)
        p0, d0 = await started(FakeEngine("flood-prefill-0", "prefill"),
                               FakeEngine("flood-decode-0", "decode"))
        membership = work / "upstreams.json"
        version = swap(membership, document([p0.upstream], [d0.upstream]))
        results: dict[str, object] = {}
        failed: list[str] = []
        ok = 0
        try:
            async with ProxyProcess.on_loopback(membership, work / "proxy.log", "--max-client-connections",
                                                str(cap), env={**os.environ, API_KEY_ENV: KEY}) as proxy:
                await proxy.wait_version(version)
                connector = aiohttp.TCPConnector(local_addr=(REQUESTER, 0), force_close=True)
                async with aiohttp.ClientSession(connector=connector,
                                                 timeout=aiohttp.ClientTimeout(total=60)) as client:
                    for _ in range(3):
                        assert await ask(client, proxy.url) is None
                    pid = proxy.proc.pid
                    serving = peak(pid, "VmRSS")
                    results["serving"] = serving
                    for name, (count, sources) in zip(("first", "second"), floods, strict=True):
                        reset_peak(pid)
                        writers = await flood(proxy.port, count, sources)
                        answers = await asyncio.gather(*(ask(client, proxy.url) for _ in range(8)))
                        ok += answers.count(None)
                        failed += [a for a in answers if a is not None]
                        results[name] = peak(pid)
                        print(f"# {name} flood: {count} connections from {sources} addresses, {len(writers)} "
                              f"opened; peak RSS {results[name] / MiB:.0f} MiB", flush=True)
                        for writer in writers:
                            writer.close()
                        await asyncio.sleep(0)
        finally:
            await asyncio.gather(p0.stop(), d0.stop())
    results["ok"], results["failed"] = ok, failed
    return results


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__)
    parser.add_argument("--cap", type=int, default=ProxyLimits().max_client_connections,
                        help="--max-client-connections (default: the rendered default)")
    args = bench.parse(parser, argv, {"cap": 64})
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    floods = [(64 if args.quick else FIRST_FLOOD, 3), (2 * args.cap, SOURCES)]
    results = asyncio.run(run(floods, args.cap))
    limit = gibibytes(DEFAULT_LIMITS["memory"])
    serving, worst = int(results["serving"]), max(int(results["first"]), int(results["second"]))
    failed = list(results["failed"])  # type: ignore[call-overload]
    bench.report(__doc__, {
        "flood_serving_rss_mb": f"{serving / MiB:.1f}",
        "flood_550_peak_rss_mb": f"{int(results['first']) / MiB:.1f}",
        "flood_twice_cap_peak_rss_mb": f"{int(results['second']) / MiB:.1f}",
        "flood_peak_of_memory_limit": f"{worst / limit:.3f}",
        "flood_peak_vs_serving_ratio": f"{worst / serving:.2f}",
        "flood_authenticated_ok": results["ok"],
        "flood_authenticated_failed": len(failed),
    })
    return bench.exit_code(failed)


if __name__ == "__main__":
    sys.exit(main())

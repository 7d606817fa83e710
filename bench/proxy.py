"""pd-proxy's speed against what users would otherwise run: the same fake engines (prefill answers
after a fixed delay, decode streams tokens at a fixed rate; tests/support/fakevllm.py, a process
each) behind (a) `pd-proxy`, (b) vllm-ascend's example proxy from the pinned release
(`examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py` @ 0.30.0rc2, run from the
release's source in .cache/upstream, one uvicorn worker, its default), and (c) no proxy: the client
calls prefill, then decode with prefill's kv_transfer_params, itself. Each at 1, 64 and 256
concurrent streaming clients, each client sending its next request when the last one ended, for a
fixed window. Per setup and level: requests/s, tokens/s, TTFT and end-to-end p50/p99, failed
requests, and the proxy process's CPU (cores busy over the window) and RSS.

Every setup's figures at every level are printed first as `# <setup> <streams> streams: ...` lines.

Figures:
- pd_proxy_requests_per_s: through pd-proxy, at the most streams
- vllm_ascend_proxy_requests_per_s: through the example proxy, at the most streams
- direct_requests_per_s: the client calling the engines itself, at the most streams
- proxy_vs_vllm_ascend_proxy_throughput_ratio: pd-proxy's requests/s over the example proxy's at
  the most streams (256; goal >= 1.5)
- proxy_added_ttft_p99_ms: pd-proxy's TTFT p99 minus the direct calls' at the middle level (64)
- pd_proxy_cpu_cores: the pd-proxy process's busiest level, in cores
- pd_proxy_rss_mb: the pd-proxy process's largest RSS over the levels
- proxy_failed_requests: requests through pd-proxy that failed or came back incomplete, all levels

`--quick`: levels 1, 8 and 32 for a short window (32 stands in for 256, 8 for 64): a smoke run.
Everything shares this machine, so absolute figures vary with its load; the ratios compare setups
measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import _paths  # noqa: F401  (tests/ on sys.path)
import aiohttp

from pd_operator.proxy.membership import Upstream, document
from pd_operator.proxy.protocol import prefill_request
from support import bench
from support.cluster import pick_port
from support.fakevllm import HOST, MODEL, FakeEngine
from support.upstream import CACHE

EXAMPLE_PROXY = CACHE / "vllm_ascend-0.30.0rc2" / "examples" / "disaggregated_prefill_v1" / \
    "load_balance_proxy_server_example.py"
ENGINES = 2
"""Prefill and decode instances each."""
PREFILL_S = 0.05
TOKEN_S = 0.025
TOKENS = 32
"""Per request: 50 ms of prefill, then 32 tokens at 40 tokens/s (about 0.8 s end to end)."""
LEVELS = (1, 64, 256)
QUICK_LEVELS = (1, 8, 32)
WINDOW_S = 15.0
QUICK_WINDOW_S = 2.0
SETUPS = ("pd_proxy", "vllm_ascend_proxy", "direct")


# --- the engines' process -------------------------------------------------------------------------

async def serve_engine(role: str, index: int) -> None:
    """One fake engine (a process each, so no two share a core's worth of Python): print its URL,
    serve until stdin closes."""
    prefill = role == "prefill"
    engine = FakeEngine(f"{role}-{index}", role, chunks=TOKENS, prefill_s=PREFILL_S if prefill else 0,
                        token_s=0 if prefill else TOKEN_S)
    await engine.start()
    engine.received = _Discard()  # a long run would keep every request otherwise
    print(engine.url, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    if engine.errors:
        print(f"{engine.name}: {len(engine.errors)} protocol errors, e.g. {engine.errors[0]}",
              file=sys.stderr)
    await engine.stop()


class _Discard(list):
    def append(self, item: object) -> None:
        pass


# --- the proxies' processes -----------------------------------------------------------------------

class Process:
    """A proxy (or the engines) as a child process; its CPU seconds and RSS from /proc."""

    def __init__(self, argv: list[str], log: pathlib.Path, stdin: bool = False) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE if stdin else self.log, stderr=self.log,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)

    def cpu_s(self) -> float:
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> tuple[float, float]:
        """(resident now, its high-water mark) in MiB."""
        status = dict(line.split(":", 1) for line in
                      pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines() if ":" in line)
        return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def wait_listening(port: int, proc: Process) -> None:
    for _ in range(600):
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.proc.args!r} exited {proc.proc.returncode}; see {proc.log.name}")
        try:
            _, writer = await asyncio.open_connection(HOST, port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listens on {HOST}:{port}")


def pd_proxy(urls: dict[str, list[str]], workdir: pathlib.Path, port: int) -> Process:
    membership = workdir / "upstreams.json"
    members = [[Upstream(f"{role}-{i}", url) for i, url in enumerate(urls[role])]
               for role in ("prefill", "decode")]
    membership.write_text(json.dumps(document(*members)))
    script = pathlib.Path(sys.executable).with_name("pd-proxy")
    return Process([str(script), "--membership", str(membership), "--host", HOST, "--port", str(port),
                    "--admin-port", str(pick_port(HOST)), "--log-level", "WARNING"], workdir / "pd-proxy.log")


def example_proxy(urls: dict[str, list[str]], workdir: pathlib.Path, port: int) -> Process:
    hosts_ports = {role: [u.removeprefix("http://").rsplit(":", 1) for u in urls[role]]
                   for role in ("prefill", "decode")}
    return Process([sys.executable, str(EXAMPLE_PROXY), "--host", HOST, "--port", str(port),
                    "--prefiller-hosts", *[h for h, _ in hosts_ports["prefill"]],
                    "--prefiller-ports", *[p for _, p in hosts_ports["prefill"]],
                    "--decoder-hosts", *[h for h, _ in hosts_ports["decode"]],
                    "--decoder-ports", *[p for _, p in hosts_ports["decode"]], "--log-level", "WARNING"],
                   workdir / "example-proxy.log")


# --- the clients ----------------------------------------------------------------------------------

@dataclass
class Level:
    setup: str
    streams: int
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tokens: int = 0
    failed: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    cpu: float | None = None
    rss: float | None = None

    def figures(self) -> dict[str, float]:
        def pct(values: list[float], q: int) -> float:
            return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000 if len(values) > 1 \
                else (values[0] * 1000 if values else float("nan"))
        out = {"requests_per_s": len(self.e2e) / self.elapsed, "tokens_per_s": self.tokens / self.elapsed,
               "ttft_p50_ms": pct(self.ttft, 50), "ttft_p99_ms": pct(self.ttft, 99),
               "e2e_p50_ms": pct(self.e2e, 50), "e2e_p99_ms": pct(self.e2e, 99),
               "failed_requests": len(self.failed)}
        if self.cpu is not None and self.rss is not None:
            out |= {"proxy_cpu_cores": self.cpu / self.elapsed, "proxy_rss_mb": self.rss}
        return out


def tokens_in(chunk: bytes) -> int:
    return chunk.count(b'"text"')


class Client:
    """Streaming completions from `streams` concurrent clients, through `url` or (url None) calling
    the engines directly."""

    def __init__(self, session: aiohttp.ClientSession, level: Level, url: str | None,
                 engines: dict[str, list[str]]) -> None:
        self.session, self.level, self.url = session, level, url
        self.prefill = itertools.cycle(engines["prefill"])
        self.decode = itertools.cycle(engines["decode"])
        self.ids = itertools.count()

    async def one(self) -> None:
        request_id = f"{self.level.setup}-{self.level.streams}-{next(self.ids)}"
        body = {"model": MODEL, "prompt": "hello", "max_tokens": TOKENS, "stream": True}
        headers = {"X-Request-Id": request_id}
        started = time.perf_counter()
        first = None
        tokens = 0
        raw = b""
        try:
            if self.url is None:
                async with self.session.post(next(self.prefill) + "/v1/completions",
                                             json=prefill_request(body), headers=headers) as resp:
                    answer = await resp.json()
                    if resp.status != 200:
                        raise ValueError(f"prefill HTTP {resp.status}: {answer}")
                target, body = next(self.decode), {**body, "kv_transfer_params": answer["kv_transfer_params"]}
            else:
                target = self.url
            async with self.session.post(target + "/v1/completions", json=body, headers=headers) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
                async for chunk in resp.content.iter_any():
                    n = tokens_in(chunk)
                    if n and first is None:
                        first = time.perf_counter()
                    tokens += n
                    raw = (raw + chunk)[-64:]
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as err:
            self.level.failed.append(f"{request_id}: {type(err).__name__}: {err}")
            return
        if tokens != TOKENS or not raw.rstrip().endswith(b"data: [DONE]") or first is None:
            self.level.failed.append(f"{request_id}: {tokens} tokens, ends {raw[-30:]!r}")
            return
        self.level.ttft.append(first - started)
        self.level.e2e.append(time.perf_counter() - started)
        self.level.tokens += tokens

    async def run(self, window: float) -> None:
        deadline = time.perf_counter() + window

        async def stream() -> None:
            while time.perf_counter() < deadline:
                await self.one()
        started = time.perf_counter()
        await asyncio.gather(*(stream() for _ in range(self.level.streams)))
        self.level.elapsed = time.perf_counter() - started


async def measure(setup: str, levels: tuple[int, ...], window: float, engines: dict[str, list[str]],
                  workdir: pathlib.Path) -> list[Level]:
    proxy = None
    url = None
    if setup != "direct":
        port = pick_port(HOST)
        proxy = (pd_proxy if setup == "pd_proxy" else example_proxy)(engines, workdir, port)
        await wait_listening(port, proxy)
        url = f"http://{HOST}:{port}"
    out = []
    connector = aiohttp.TCPConnector(limit=0)
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await Client(session, Level(setup, 1), url, engines).run(0.3)  # warm: connections, imports
            for streams in levels:
                level = Level(setup, streams)
                cpu = proxy.cpu_s() if proxy else 0.0
                await Client(session, level, url, engines).run(window)
                if proxy:
                    level.cpu = proxy.cpu_s() - cpu
                    level.rss = proxy.rss_mb()[0]
                out.append(level)
    finally:
        if proxy:
            proxy.stop()
    return out


async def main_async(levels: tuple[int, ...], window: float) -> dict[str, dict[int, Level]]:
    assert EXAMPLE_PROXY.is_file(), f"{EXAMPLE_PROXY} is missing: make upstream"
    with bench.workdir("pd-bench-proxy-") as workdir:
        procs = {(role, i): Process([sys.executable, __file__, "--serve-engine", role, str(i)],
                                    workdir / f"{role}-{i}.log", stdin=True)
                 for role in ("prefill", "decode") for i in range(ENGINES)}
        try:
            engines: dict[str, list[str]] = {"prefill": [], "decode": []}
            for (role, i), proc in procs.items():
                assert proc.proc.stdout is not None
                line = await asyncio.to_thread(proc.proc.stdout.readline)
                if not line:
                    log = (workdir / f"{role}-{i}.log").read_text()
                    raise RuntimeError(f"{role}-{i} did not start: {log}")
                engines[role].append(line.decode().strip())
            results = {}
            for setup in SETUPS:
                measured = await measure(setup, levels, window, engines, workdir)
                results[setup] = {level.streams: level for level in measured}
        finally:
            for (role, i), proc in procs.items():
                proc.stop()
                if errors := (workdir / f"{role}-{i}.log").read_text().strip():
                    print(errors[-2000:], file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__)
    parser.add_argument("--window", type=float, default=WINDOW_S, help="seconds per level and setup")
    parser.add_argument("--levels", type=int, nargs=3, metavar="STREAMS", default=LEVELS,
                        help=f"three levels of concurrent streams (default {' '.join(map(str, LEVELS))})")
    parser.add_argument("--serve-engine", nargs=2, metavar=("ROLE", "INDEX"), help=argparse.SUPPRESS)
    args = bench.parse(parser, argv, {"window": QUICK_WINDOW_S, "levels": QUICK_LEVELS})
    if args.serve_engine:
        asyncio.run(serve_engine(args.serve_engine[0], int(args.serve_engine[1])))
        return 0
    levels = tuple(args.levels)
    results = asyncio.run(main_async(levels, args.window))
    print(f"# engines: {ENGINES} prefill, {ENGINES} decode; prefill {PREFILL_S * 1000:.0f} ms, "
          f"{TOKENS} tokens at {1 / TOKEN_S:.0f}/s; {args.window:g} s per level")
    for setup, by_level in results.items():
        for streams, level in by_level.items():
            text = ", ".join(f"{name} {value:.2f}" if isinstance(value, float) else f"{name} {value}"
                             for name, value in level.figures().items())
            print(f"# {setup} {streams} streams: {text}")
    most, middle = levels[-1], levels[1]
    ours, theirs, direct = (results[s] for s in SETUPS)
    failed = [f for level in ours.values() for f in level.failed]
    ours_most = ours[most].figures()
    busiest = max(level.figures().get("proxy_cpu_cores", 0.0) for level in ours.values())
    largest = max(level.figures().get("proxy_rss_mb", 0.0) for level in ours.values())
    bench.report(__doc__, {
        "pd_proxy_requests_per_s": f"{ours_most['requests_per_s']:.2f}",
        "vllm_ascend_proxy_requests_per_s": f"{theirs[most].figures()['requests_per_s']:.2f}",
        "direct_requests_per_s": f"{direct[most].figures()['requests_per_s']:.2f}",
        "proxy_vs_vllm_ascend_proxy_throughput_ratio":
            f"{ours_most['requests_per_s'] / theirs[most].figures()['requests_per_s']:.2f}",
        "proxy_added_ttft_p99_ms":
            f"{ours[middle].figures()['ttft_p99_ms'] - direct[middle].figures()['ttft_p99_ms']:.1f}",
        "pd_proxy_cpu_cores": f"{busiest:.2f}",
        "pd_proxy_rss_mb": f"{largest:.1f}",
        "proxy_failed_requests": len(failed),
    })
    for setup, by_level in results.items():
        for level in by_level.values():
            for failure in level.failed[:3]:
                print(f"  {setup}: {failure}", file=sys.stderr)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

"""pd-proxy's metrics port after known traffic (issue 34): every series proxy/metrics.py documents
(SERIES) is scraped from the real process and checked against the requests sent: outcomes by path,
TTFT, end-to-end and KV-hop histograms counting the requests that got decode's first byte, retries
and re-prefills counted from what the failing engines received, in-flight per member while a
request is held. The scrape needs no key, and nothing but /metrics is served there."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pd_operator.proxy.membership import document
from pd_operator.proxy.metrics import SERIES
from pd_operator.proxy.options import API_KEY_ENV
from support.fakevllm import MODEL, WAIT_S, FakeEngine, ProxyProcess, started, swap, vllm_error

pytestmark = pytest.mark.security

KEY = "metrics-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
NORMAL = {"model": MODEL, "prompt": "hello", "max_tokens": 16}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def get_metrics(proxy: ProxyProcess) -> tuple[int, str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client, \
            client.get(proxy.metrics_url + "/metrics") as resp:
        return resp.status, await resp.text()


async def _metrics(tmp_path: Path) -> None:
    p0 = FakeEngine("glm-flash-prefill-0", "prefill")
    broken = FakeEngine("glm-flash-prefill-1", "prefill", canned=vllm_error(500, "boom"))
    d0 = FakeEngine("glm-flash-decode-0", "decode")
    dying = FakeEngine("glm-flash-decode-1", "decode", dies=True)
    engines = await started(p0, broken, d0, dying)
    membership = tmp_path / "upstreams.json"
    version = swap(membership, document([p0.upstream, broken.upstream], [d0.upstream, dying.upstream]))
    try:
        async with ProxyProcess.on_loopback(membership, tmp_path / "proxy.log", "--retry-delay", "0",
                                            "--max-prefills", "3", env={**os.environ, API_KEY_ENV: KEY}) \
                as proxy, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client:
            await proxy.wait_version(version)
            sent = {"/v1/completions": 0, "/v1/chat/completions": 0}
            for i in range(6):
                path, body = ("/v1/completions", NORMAL) if i % 2 else ("/v1/chat/completions", CHAT)
                async with client.post(proxy.url + path, json={**body, "stream": i % 3 == 0},
                                       headers=AUTH) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                sent[path] += 1
            async with client.post(proxy.url + "/v1/completions", json=NORMAL) as resp:
                assert resp.status == 401
            async with client.post(proxy.url + "/v1/completions", data=b"{not json",
                                   headers={**AUTH, "Content-Type": "application/json"}) as resp:
                assert resp.status == 400
            _, quiet = await get_metrics(proxy)
            # A request held in decode: in flight on its members.
            await proxy.wait_version(swap(membership, document([p0.upstream], [d0.upstream])))
            hold = d0.hold("answer")
            asking = asyncio.create_task(client.post(proxy.url + "/v1/completions", json=NORMAL,
                                                     headers=AUTH))
            await hold.caught_at_least(1)
            _, busy = await get_metrics(proxy)
            hold.release()
            (await asyncio.wait_for(asking, WAIT_S)).release()
            on_clients_port = await client.get(proxy.url + "/metrics", headers=AUTH)
            on_metrics_port = await client.get(proxy.metrics_url + "/v1/models")
    finally:
        await asyncio.gather(*(e.stop() for e in engines))
    samples = scrape(quiet)
    families = {f.name for f in text_string_to_metric_families(quiet)}
    documented = {name.removesuffix("_total") for name in SERIES}
    assert documented <= families, documented - families
    ok = sum(sent.values())
    for path, n in sent.items():
        assert value(samples, "pd_proxy_requests_total", path=path, outcome="ok") == n
        assert value(samples, "pd_proxy_time_to_first_token_seconds_count", path=path) == n
        refused = 2 if path == "/v1/completions" else 0  # the 401 and the 400 below: answered too
        assert value(samples, "pd_proxy_request_duration_seconds_count", path=path) == n + refused
    assert value(samples, "pd_proxy_requests_total", path="/v1/completions", outcome="unauthorized") == 1
    assert value(samples, "pd_proxy_requests_total", path="/v1/completions", outcome="invalid") == 1
    assert value(samples, "pd_proxy_kv_hop_seconds_count") == ok
    failed_prefills, failed_decodes = len(broken.received), len(dying.received)
    assert failed_prefills and failed_decodes, (failed_prefills, failed_decodes)
    assert value(samples, "pd_proxy_retries_total", role="prefill") == failed_prefills
    assert value(samples, "pd_proxy_reprefills_total") == failed_decodes
    assert value(samples, "pd_proxy_retries_total", role="decode") == failed_decodes
    assert value(samples, "pd_proxy_upstream_inflight", role="decode", upstream=d0.name) == 0
    held = scrape(busy)
    assert value(held, "pd_proxy_upstream_inflight", role="decode", upstream=d0.name) == 1
    assert value(held, "pd_proxy_upstream_awaiting_decode", upstream=p0.name) == 1
    assert on_clients_port.status == 404 and on_metrics_port.status == 404


def test_every_documented_series_counts_the_requests_sent(tmp_path):
    asyncio.run(_metrics(tmp_path))

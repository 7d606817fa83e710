"""The real `pd-proxy` process following its membership file under load (issue 18, items 3 and 4).

Fake prefill/decode engines on loopback (support/fakevllm.py) answer like vLLM's OpenAI endpoints
in PD mode; the membership file is replaced atomically, as the kubelet swaps a projected ConfigMap.
While a few clients keep sending requests, decode goes 1 -> 2 -> 1 and prefill 2 -> 1: no request
fails, a new member gets requests once the proxy reports its version, a member that left gets no
request begun after the proxy reported the version without it, and what it still carried
(/pd/state inflight, awaitingDecode) survives the change and drops to 0 once released.
"""

from __future__ import annotations

import asyncio

import pytest

from pd_operator.proxy.membership import Upstream, document
from support.fakevllm import FakeEngine, Load, ProxyProcess, load_of, refusing_url, started, swap, until

pytestmark = pytest.mark.scaling

CLIENTS = 6


def from_engine(name: str):
    """A decode request whose KV comes from the prefill instance `name`."""
    return lambda body: body["kv_transfer_params"]["remote_engine_id"] == name


async def _scale_under_load(tmp_path) -> None:
    p0, p1, d0, d1 = await started(
        FakeEngine("glm-flash-prefill-0", "prefill"), FakeEngine("glm-flash-prefill-1", "prefill"),
        FakeEngine("glm-flash-decode-0", "decode"), FakeEngine("glm-flash-decode-1", "decode"))
    membership = tmp_path / "upstreams.json"
    swap(membership, document([p0.upstream, p1.upstream], [d0.upstream]))
    try:
        async with ProxyProcess.on_loopback(membership, tmp_path / "proxy.log") as proxy, \
                Load(proxy.url, clients=CLIENTS) as load:
            await load.completed_after(0, 10)
            assert not d1.received, "decode-1 is not a member yet"

            # decode 1 -> 2: the new member gets requests once the proxy follows the new version.
            await proxy.wait_version(swap(membership, document([p0.upstream, p1.upstream],
                                                               [d0.upstream, d1.upstream])))
            await until("decode-1 to get a request", lambda: d1.received)

            # decode 2 -> 1 while decode-1 streams a held request.
            streaming = d1.hold("stream")
            await streaming.caught_at_least(1)
            d1_out = await proxy.wait_version(swap(membership, document([p0.upstream, p1.upstream],
                                                                        [d0.upstream])))
            d1_mark, d1_count = load.mark(), len(d1.received)
            assert load_of(d1_out, d1.name)[0] >= 1, "the held stream is still in flight on decode-1"
            await load.completed_after(d1_mark, 10)
            streaming.release()
            await proxy.wait_state("decode-1 to carry nothing", lambda s: load_of(s, d1.name) == (0, 0))
            d1_drained = len(d1.received)

            # prefill 2 -> 1 while prefill-1 computes a held prompt and a request prefilled there
            # waits for decode's first token.
            pulling = d0.hold("answer", match=from_engine(p1.name))
            await pulling.caught_at_least(1)
            prefilling = p1.hold("answer")
            await prefilling.caught_at_least(1)
            p1_out = await proxy.wait_version(swap(membership, document([p0.upstream], [d0.upstream])))
            p1_mark, p1_count = load.mark(), len(p1.received)
            inflight, awaiting = load_of(p1_out, p1.name)
            assert inflight >= 1 and awaiting >= 1, f"prefill-1 carries {inflight} prefills, {awaiting} pulls"
            await load.completed_after(p1_mark, 10)
            prefilling.release()
            pulling.release()
            await proxy.wait_state("prefill-1 to carry nothing", lambda s: load_of(s, p1.name) == (0, 0))
            await load.completed_after(load.mark(), 10)
            p1_drained = len(p1.received)
            await load.stop()
            final = await proxy.state()
    finally:
        await asyncio.gather(*(e.stop() for e in (p0, p1, d0, d1)))

    assert load.failures == [], load.failures[:10]
    assert [e for engine in (p0, p1, d0, d1) for e in engine.errors] == []
    # Nothing begun after the proxy reported the version without them reached them...
    assert not load.started_after(d1_mark) & d1.ids
    assert not load.started_after(p1_mark) & p1.ids
    # ...and in numbers: at most what was already in flight to them at that moment arrived later,
    # nothing once they were drained.
    assert len(d1.received) - d1_count <= load_of(d1_out, d1.name)[0]
    assert len(p1.received) - p1_count <= load_of(p1_out, p1.name)[0]
    assert (len(d1.received), len(p1.received)) == (d1_drained, p1_drained)
    # The survivors carried the load, and the departed no longer show in /pd/state.
    assert load.started_after(p1_mark) & p0.ids and load.started_after(p1_mark) & d0.ids
    assert set(final.upstreams) == {p0.name, d0.name}


def test_membership_changes_under_load_fail_no_request(tmp_path):
    asyncio.run(_scale_under_load(tmp_path))


async def _members_that_refuse(tmp_path) -> None:
    p0, d0 = await started(FakeEngine("glm-flash-prefill-0", "prefill"),
                           FakeEngine("glm-flash-decode-0", "decode"))
    dead_p = Upstream("glm-flash-prefill-1", refusing_url())
    dead_d = Upstream("glm-flash-decode-1", refusing_url())
    membership = tmp_path / "upstreams.json"
    version = swap(membership, document([p0.upstream, dead_p], [d0.upstream, dead_d]))
    try:
        async with ProxyProcess.on_loopback(membership, tmp_path / "proxy.log", "--retry-delay", "0") \
                as proxy, Load(proxy.url, clients=2) as load:
            await load.completed_after(0, 12)
            await load.stop()
            state = await proxy.state()
    finally:
        await asyncio.gather(p0.stop(), d0.stop())
    assert load.failures == [] and p0.errors == d0.errors == []
    assert state.version == version
    assert load_of(state, dead_p.name) == load_of(state, dead_d.name) == (0, 0)
    assert len(p0.received) == len(d0.received) == len(load.completed)
    # Least in-flight with round-robin ties sent some first attempts to the dead members, so the
    # retries on the live ones are what kept every request whole.
    log = (tmp_path / "proxy.log").read_text()
    assert f"prefill call to {dead_p.name} failed" in log and f"decode call to {dead_d.name} failed" in log


def test_a_member_that_refuses_connections_costs_no_request(tmp_path):
    asyncio.run(_members_that_refuse(tmp_path))


async def _no_members_and_bad_files(tmp_path) -> None:
    p0, d0 = await started(FakeEngine("glm-flash-prefill-0", "prefill"),
                           FakeEngine("glm-flash-decode-0", "decode"))
    membership = tmp_path / "upstreams.json"  # missing at start
    body = {"model": "fake-model", "prompt": "hello", "max_tokens": 16}
    try:
        async with ProxyProcess.on_loopback(membership, tmp_path / "proxy.log") as proxy:
            assert (await proxy.get("/healthcheck"))[0] == 503
            assert (await proxy.state()).version is None
            status, answer = await proxy.post("/v1/completions", body)
            assert status == 503 and "no prefill and no decode instance" in answer["error"]["message"]

            good = swap(membership, document([p0.upstream], [d0.upstream]))
            await proxy.wait_version(good)
            assert (await proxy.get("/healthcheck")) == (200, {
                "status": "ok", "version": good, "prefill_instances": 1, "decode_instances": 1,
                "request_num": 0})
            assert (await proxy.post("/v1/completions", body))[0] == 200
            assert (await proxy.get("/v1/models"))[1]["data"][0]["id"] == "fake-model"

            for seen, bad in enumerate(("{not json", '{"version": "0", "prefill": [], "decode": []}'), 1):
                (membership.with_name("bad")).write_text(bad)
                membership.with_name("bad").replace(membership)
                await until("the proxy to log the bad file",
                            lambda n=seen: proxy.log.read_text().count("is malformed") == n)
                assert (await proxy.state()).version == good
                assert (await proxy.post("/v1/completions", body))[0] == 200
            membership.unlink()
            await until("the proxy to log the missing file", lambda: "is missing" in proxy.log.read_text())
            assert (await proxy.post("/v1/completions", body))[0] == 200

            no_decode = swap(membership, document([p0.upstream], []))
            await proxy.wait_version(no_decode)
            status, answer = await proxy.post("/v1/completions", body)
            assert status == 503 and answer["error"]["message"].startswith("no decode instance")
            assert (await proxy.get("/healthcheck"))[0] == 503
    finally:
        await asyncio.gather(p0.stop(), d0.stop())
    assert len(p0.received) == len(d0.received) == 4


def test_without_members_the_proxy_answers_503_and_bad_files_keep_the_last_good_membership(tmp_path):
    asyncio.run(_no_members_and_bad_files(tmp_path))


async def _killed_with_requests_in_flight(tmp_path) -> None:
    p0, p1, d0, d1 = await started(
        FakeEngine("glm-flash-prefill-0", "prefill"), FakeEngine("glm-flash-prefill-1", "prefill"),
        FakeEngine("glm-flash-decode-0", "decode"), FakeEngine("glm-flash-decode-1", "decode"))
    membership = tmp_path / "upstreams.json"
    swap(membership, document([p0.upstream, p1.upstream], [d0.upstream, d1.upstream]))
    try:
        async with ProxyProcess.on_loopback(membership, tmp_path / "proxy.log") as proxy, \
                Load(proxy.url, clients=CLIENTS) as load:
            streaming = d1.hold("stream")
            pulling = d0.hold("answer", match=from_engine(p1.name))
            await streaming.caught_at_least(1)
            await pulling.caught_at_least(1)
            await d1.kill()
            await p1.kill()
            pulling.release()
            await until("the two held requests to fail", lambda: len(load.failures) >= 2)
            await load.stop()
    finally:
        await asyncio.gather(*(e.stop() for e in (p0, p1, d0, d1)))
    assert any("does not end with [DONE]" in f for f in load.failures), load.failures
    assert any(f"KV pull from {p1.name} failed" in e for e in d0.errors), d0.errors


def test_an_instance_killed_with_requests_in_flight_fails_them(tmp_path):
    """What deleting an instance too early does (and what support/podnet.py does to a deleted
    pod's engine): a decode stream is cut, and a request prefilled there cannot pull its KV."""
    asyncio.run(_killed_with_requests_in_flight(tmp_path))

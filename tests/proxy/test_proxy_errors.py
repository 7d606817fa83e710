"""The real `pd-proxy` process when an engine fails: what the client gets, which members were
tried in which order, and that /pd/state carries nothing afterwards.

The expectations are a client's of vLLM's OpenAI server and of vllm-ascend's example proxy
(vllm-project/vllm-ascend: examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py
@ v0.30.0rc2, `send_request_to_service`, `stream_service_response`, `handle_completions_impl`), as
pd-proxy's docstring and docs/architecture.md state them:
- a 4xx is the request's own fault: it goes to the client as the engine sent it, not retried (the
  example retries every 4xx but 400; a 404 "model not found" is no better on another try);
- a 5xx, a refused connection or an answer prefill cannot have sent (not a JSON object, or one
  without kv_transfer_params: decode must never get the client's own) is tried again on a member
  not tried yet, up to --max-retries attempts per role; then the client gets the last engine's
  error as it was, or the proxy's own 502 when no engine answered one;
- a decode that refuses the connection got nothing: the same prefilled request goes to another
  decode. A decode that fails after it got the request (a 5xx, a connection dropped before the
  first byte) may have pulled the KV, and prefill frees pulled blocks: the request is prefilled
  again for the next decode, at most --max-prefills times in all (the fake engines' blocks can be
  pulled once, so a decode sent the old blocks would fail its pull, and that is checked: no engine
  records an error);
- once decode has sent bytes nothing is retried: decode has pulled prefill's KV by then (the example
  proxy never retries after the first chunk); a stream that breaks ends the client's stream.

Each scenario runs its own proxy process and fake engines (support/fakevllm.py). A scenario with
one misbehaving member among good ones sends requests until one was first routed to that member
and one to a good member (least in flight, ties round robin), checking every one of them.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from pd_operator.api.types import ROLES
from pd_operator.proxy.membership import Upstream, document
from support.fakevllm import (
    MODEL,
    WAIT_S,
    Canned,
    FakeEngine,
    Hold,
    ProxyProcess,
    check_answer,
    load_of,
    refusing_url,
    started,
    swap,
    vllm_error,
)

pytestmark = pytest.mark.scaling

ATTEMPTS = 3
"""--max-retries: attempts per call."""
PREFILLS = 2
"""--max-prefills: prefills of one request (each decode failure after it may have pulled costs one)."""
ROTATIONS = 4
"""Requests a scenario with one misbehaving member may send to see both kinds of first pick."""
CHUNKS = 4
"""Tokens a decode answer has."""

# How a member behaves (one per member of a role in a scenario).
OK = "answers"
E400, E404, E500, E502, E503 = "400", "404", "500", "502", "503"
NOT_JSON = "not JSON"
ARRAY = "a JSON array"
NO_KV = "an answer without kv_transfer_params"
REFUSED = "refuses connections"
CUT = "breaks after its first bytes"
DIES = "dies after pulling the KV"

# What the client gets.
WHOLE = "the complete answer"
FORWARDED = "the last engine's error body as it was"
GATEWAY = "the proxy's own 502"
TRUNCATED = "the stream up to the break"

FAILED = re.compile(r"WARNING pd_operator.proxy: (prefill|decode) call to (\S+) failed "
                    r"\(attempt (\d+) of (\d+)\): (.*)$")
"""The proxy's log line for a failed attempt: role, member, attempt, attempts, why."""


def canned(behaviour: str, name: str) -> Canned | None:
    if behaviour.isdigit():
        return vllm_error(int(behaviour), f"{name} answers {behaviour}")
    if behaviour == NOT_JSON:  # what a gateway in front of a dead pod may answer
        return Canned(200, b"<html><body>upstream connect error</body></html>", "text/html")
    if behaviour == ARRAY:
        return Canned(200, b"[1, 2]")
    if behaviour == NO_KV:  # a prefill that is no kv_producer: decode would compute the prompt itself
        return Canned(200, json.dumps({"id": "x", "object": "text_completion", "choices": [
            {"index": 0, "text": "x", "finish_reason": "length"}]}).encode())
    return None


@dataclass(frozen=True)
class Scenario:
    prefill: tuple[str, ...]
    """One behaviour per prefill member."""
    decode: tuple[str, ...]
    stream: bool
    status: int
    answer: str
    prefill_tries: tuple[str, ...]
    """The behaviours of the prefill members tried, in order (when the first try went to the
    misbehaving member of a mixed role)."""
    decode_tries: tuple[str, ...]

    def mixed(self) -> tuple[str, str] | None:
        """The role with one misbehaving member among good ones, and that member's behaviour (at
        most one such role, the other one answering: a request routed to good members succeeds)."""
        roles = dict(zip(ROLES, (self.prefill, self.decode), strict=True))
        mixed = [role for role, behaviours in roles.items() if len(set(behaviours)) > 1]
        if not mixed:
            return None
        (role,) = mixed
        (other,) = set(ROLES) - {role}
        (bad,) = set(roles[role]) - {OK}
        assert set(roles[other]) == {OK}, self
        return role, bad


SCENARIOS = {
    "success": Scenario((OK, OK), (OK, OK), False, 200, WHOLE, (OK,), (OK,)),
    "success-streaming": Scenario((OK, OK), (OK, OK), True, 200, WHOLE, (OK,), (OK,)),
    "prefill-400-not-retried": Scenario((E400, E400), (OK,), False, 400, FORWARDED, (E400,), ()),
    "prefill-404-not-retried": Scenario((E404, E404), (OK,), True, 404, FORWARDED, (E404,), ()),
    "prefill-500-on-every-member": Scenario((E500, E500), (OK,), False, 500, FORWARDED,
                                            (E500,) * ATTEMPTS, ()),
    "prefill-500-on-one-member": Scenario((E500, OK), (OK,), False, 200, WHOLE, (E500, OK), (OK,)),
    "prefill-answers-not-json": Scenario((NOT_JSON, NOT_JSON), (OK,), False, 502, GATEWAY,
                                         (NOT_JSON,) * ATTEMPTS, ()),
    "prefill-answers-an-array": Scenario((ARRAY, OK), (OK,), True, 200, WHOLE, (ARRAY, OK), (OK,)),
    # Without prefill's KV location decode would get none, or the client's own: never passed on.
    "prefill-answers-without-kv-params": Scenario((NO_KV, NO_KV), (OK,), False, 502, GATEWAY,
                                                  (NO_KV,) * ATTEMPTS, ()),
    "prefill-answers-without-kv-params-on-one-member": Scenario((NO_KV, OK), (OK,), True, 200, WHOLE,
                                                                (NO_KV, OK), (OK,)),
    "decode-400-not-retried": Scenario((OK,), (E400, E400), True, 400, FORWARDED, (OK,), (E400,)),
    # A decode 5xx may come after its pull: each decode attempt gets a new prefill, up to PREFILLS.
    "decode-503-on-every-member": Scenario((OK,), (E503, E503), True, 503, FORWARDED, (OK,) * PREFILLS,
                                           (E503,) * PREFILLS),
    "decode-503-on-one-member": Scenario((OK,), (E503, OK), False, 200, WHOLE, (OK, OK), (E503, OK)),
    "decode-503-on-one-member-streaming": Scenario((OK,), (E503, OK), True, 200, WHOLE, (OK, OK),
                                                   (E503, OK)),
    "decode-502-on-every-member": Scenario((OK,), (E502, E502), False, 502, FORWARDED, (OK,) * PREFILLS,
                                           (E502,) * PREFILLS),
    "decode-dies-after-pulling": Scenario((OK,), (DIES, OK), False, 200, WHOLE, (OK, OK), (DIES, OK)),
    "decode-dies-after-pulling-streaming": Scenario((OK,), (DIES, OK), True, 200, WHOLE, (OK, OK),
                                                    (DIES, OK)),
    "decode-dies-after-pulling-on-every-member": Scenario((OK,), (DIES, DIES), False, 502, GATEWAY,
                                                          (OK,) * PREFILLS, (DIES,) * PREFILLS),
    "prefill-member-refuses": Scenario((REFUSED, OK), (OK,), False, 200, WHOLE, (REFUSED, OK), (OK,)),
    "decode-member-refuses": Scenario((OK,), (REFUSED, OK), True, 200, WHOLE, (OK,), (REFUSED, OK)),
    "only-prefill-refuses": Scenario((REFUSED,), (OK,), False, 502, GATEWAY, (REFUSED,) * ATTEMPTS, ()),
    "only-decode-refuses": Scenario((OK,), (REFUSED,), True, 502, GATEWAY, (OK,), (REFUSED,) * ATTEMPTS),
    "decode-stream-breaks-after-first-token": Scenario((OK,), (CUT,), True, 200, TRUNCATED, (OK,), (CUT,)),
    "decode-whole-answer-breaks-after-first-bytes": Scenario((OK,), (CUT,), False, 502, GATEWAY, (OK,),
                                                             (CUT,)),
}


@dataclass
class Answer:
    request_id: str
    status: int
    content_type: str
    body: bytes
    tries: dict[str, list[str]]
    """Per role, the members tried in order."""


@dataclass
class Run:
    """One scenario's members, proxy and client."""

    scenario: Scenario
    engines: dict[str, FakeEngine]
    """The members that listen, by name."""
    members: dict[str, list[Upstream]]
    behaviour: dict[str, str]
    proxy: ProxyProcess
    client: aiohttp.ClientSession

    async def ask(self, request_id: str) -> Answer:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 16, "stream": self.scenario.stream}
        if self.scenario.stream:
            body["stream_options"] = {"include_usage": True}
        logged = len(self.proxy.log.read_bytes())
        cutting = [engine for engine in self.engines.values() if engine.cut]
        cuts = [engine.hold("cut") for engine in cutting]
        sending = asyncio.create_task(self._post(body, request_id))
        for engine, cut in zip(cutting, cuts, strict=True):
            await self._cut_after_first_bytes(engine, cut, sending)
        status, content_type, raw = await sending
        failures = [FAILED.search(line) for line in
                    self.proxy.log.read_bytes()[logged:].decode().splitlines()]
        return Answer(request_id, status, content_type, raw,
                      {role: self._tries(role, request_id, [f for f in failures if f and f[1] == role])
                       for role in ROLES})

    async def _post(self, body: dict, request_id: str) -> tuple[int, str, bytes]:
        async with self.client.post(self.proxy.url + "/v1/completions", json=body,
                                    headers={"X-Request-Id": request_id}) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.read()

    async def _cut_after_first_bytes(self, engine: FakeEngine, cut: Hold, sending: asyncio.Task) -> None:
        """Let `engine` drop its connection only once the proxy has read its first bytes, which
        /pd/state shows as prefill's blocks no longer awaiting decode (while the call to `engine`
        is still in flight)."""
        await cut.caught_at_least(1)
        prefills = [u.name for u in self.members["prefill"]]
        state = await self.proxy.wait_state("the proxy to read decode's first bytes",
                                            lambda s: all(load_of(s, name)[1] == 0 for name in prefills))
        assert load_of(state, engine.name) == (1, 0) and not sending.done()
        cut.release()

    def _tries(self, role: str, request_id: str, failures: list[re.Match]) -> list[str]:
        """The members of `role` tried for this request, in order: the engines' calls in the order
        they came, with the members the proxy logged as failed that refuse connections (they show
        only there) in their logged places. In a scenario a role's failed calls come before those
        answered: the logged failures of engines are its first calls, in the same order."""
        assert [int(f[3]) for f in failures] == list(range(1, len(failures) + 1))
        assert all(int(f[4]) == ATTEMPTS for f in failures)
        for failure in failures:
            behaviour = self.behaviour[failure[2]]
            if behaviour.isdigit():
                assert failure[5] == f"HTTP {behaviour}", failure[0]
        names = {u.name for u in self.members[role]}
        calls = [name for _, name in sorted((r.order, e.name) for e in self.engines.values()
                                            for r in e.received if r.request_id == request_id)
                 if name in names]
        failed = [f[2] for f in failures]
        reached = [n for n in failed if n in self.engines]
        assert calls[:len(reached)] == reached, f"{role}: calls {calls}, logged failures {failed}"
        return failed + calls[len(reached):]

    async def check(self, answer: Answer, tries: dict[str, tuple[str, ...]], status: int, kind: str,
                    version: str) -> None:
        for role in ROLES:
            got = answer.tries[role]
            assert tuple(self.behaviour[n] for n in got) == tries[role], (role, got)
            distinct = min(len(got), len(self.members[role]))
            assert len(set(got[:distinct])) == distinct, f"{role}: a member was tried twice first: {got}"
        assert answer.status == status, answer
        self._check_body(answer, kind)
        state = await self.proxy.state()
        assert state.version == version
        names = [u.name for role in ROLES for u in self.members[role]]
        assert {n: load_of(state, n) for n in names} == dict.fromkeys(names, (0, 0))

    def _check_body(self, answer: Answer, kind: str) -> None:
        stream = self.scenario.stream
        mime = answer.content_type.split(";")[0]
        last = next((tried[-1] for tried in (answer.tries["decode"], answer.tries["prefill"]) if tried), "")
        if kind == WHOLE:
            assert mime == ("text/event-stream" if stream else "application/json"), answer
            assert check_answer(answer.status, answer.body, chat=False, stream=stream, usage=stream,
                                chunks=CHUNKS) is None
        elif kind == FORWARDED:
            sent = self.engines[last].canned
            assert sent is not None
            assert (answer.body, answer.content_type) == (sent.body, sent.content_type), answer
        elif kind == GATEWAY:
            assert mime == "application/json", answer
            error = json.loads(answer.body)["error"]
            assert (error["type"], error["code"]) == ("upstream_error", 502), error
            assert f"instance {last} failed" in error["message"], error
        else:
            assert kind == TRUNCATED and mime == "text/event-stream", answer
            events = [json.loads(e.removeprefix("data: ")) for e in answer.body.decode().split("\n\n") if e]
            assert [e["choices"][0]["text"] for e in events] == ["t0 "], answer


async def _run(scenario: Scenario, tmp_path: Path) -> None:
    behaviour, engines, members = {}, {}, {}
    for role, behaviours in zip(ROLES, (scenario.prefill, scenario.decode), strict=True):
        for i, b in enumerate(behaviours):
            name = f"glm-flash-{role}-{i}"
            behaviour[name] = b
            if b != REFUSED:
                engines[name] = FakeEngine(name, role, CHUNKS, canned=canned(b, name), cut=b == CUT,
                                           dies=b == DIES)
    await started(*engines.values())
    refusing = {name: Upstream(name, refusing_url()) for name, b in behaviour.items() if b == REFUSED}
    for role in ROLES:
        members[role] = [engines[n].upstream if n in engines else refusing[n]
                         for n in behaviour if n.startswith(f"glm-flash-{role}-")]
    membership = tmp_path / "upstreams.json"
    version = swap(membership, document(members["prefill"], members["decode"]))
    mixed = scenario.mixed()
    first_tries: set[str | None] = set()
    try:
        bounds = ("--max-retries", str(ATTEMPTS), "--max-prefills", str(PREFILLS))
        async with ProxyProcess.on_loopback(membership, tmp_path / "proxy.log", "--retry-delay", "0",
                                            *bounds) as proxy, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client:
            run = Run(scenario, engines, members, behaviour, proxy, client)
            tries = {"prefill": scenario.prefill_tries, "decode": scenario.decode_tries}
            for k in range(ROTATIONS if mixed else 1):
                answer = await run.ask(f"request-{k}")
                first = behaviour[answer.tries[mixed[0]][0]] if mixed else None
                if first == OK:  # routed to good members only: a plain success
                    await run.check(answer, {"prefill": (OK,), "decode": (OK,)}, 200, WHOLE, version)
                else:
                    await run.check(answer, tries, scenario.status, scenario.answer, version)
                first_tries.add(first)
                if not mixed or first_tries == {OK, mixed[1]}:
                    break
    finally:
        await asyncio.gather(*(e.stop() for e in engines.values()))
    assert not mixed or first_tries == {OK, mixed[1]}, f"first tries went only to {first_tries}"
    assert [e for engine in engines.values() for e in engine.errors] == []


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_an_engine_failure_reaches_the_client_as_a_client_of_vllm_expects(name, tmp_path):
    asyncio.run(_run(SCENARIOS[name], tmp_path))

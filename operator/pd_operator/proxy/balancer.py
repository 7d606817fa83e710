"""Who gets the next request, and what each upstream still carries. No I/O; one event loop owns it.

Members come only from the current membership document; counts are kept by instance name and
outlive membership, so an instance that left the document still shows what it carries until that
is done (the operator drains it by these counts), after which its name is dropped.

A member whose call just failed (a 5xx, a refused or timed-out connection) rests for a while:
COOLDOWN_S, doubling with each failure in a row up to MAX_COOLDOWN_S, and cleared by its next
answer. Without it "fewest in flight" would send most first attempts to a dead instance, which
carries nothing, until the operator takes it out of the membership (its pods go not Ready, the
kubelet projects the new file: up to a minute or more), each costing a retry or a connect timeout.
A resting member is still picked when no other is left to try.

Prefill by prefix (proxy/prefix_routing.py): with a prefix routing mode on and a request whose token
ids are known, the prefill member is the one with the least prompt tokens to compute before this
request's first token, its own (the prompt less the prefix it is expected to hold) plus what is
left of the prefills in flight there; otherwise, and for decode always, the one with the fewest
requests in flight. What is left: the tokens of the calls in flight less what the member is
expected to have computed since its last answer (or since it became busy), at the rate its answered
calls were computed (tokens over the time each took, counted from its start or the answer before,
whichever is later, as an engine computing in arrival order takes them). Until a member has answered,
nothing is taken off. Without it a member finishing a long prompt looks as busy as one that has just
started it, and a prompt of 100,000 tokens takes 16 s to compute (docs/benchmarks.md). The rate is
learned, never a cost constant of the model, and it follows the recent answers: each weighs half as
much RATE_HALF_LIFE_ANSWERS answers later, so a prefill whose speed changes behind the same name (a
replaced pod, contention, other hardware) is followed within a few hundred answers rather than after
as many as it answered before; a member relisted on another URL or KV layout (another address or
engine configuration) learns it again from its next answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pd_operator.api.types import ROLES
from pd_operator.proxy.membership import Membership, ProxyState, Upstream, UpstreamLoad
from pd_operator.proxy.prefix_routing import DEFAULT_MODE, Mode, PrefixRouter, Prompt

COOLDOWN_S = 2.0
MAX_COOLDOWN_S = 30.0
RATE_HALF_LIFE_ANSWERS = 64
"""Answers after which an answer weighs half as much in a prefill's rate (module doc). One answer's
rate swings with its prompt (a fixed part per call makes a short prompt slow per token, and prompts
are long-tailed: docs/benchmarks.md), so the rate averages over tens of answers to stay steady; a new
speed then carries 7/8 of the weight after three half-lives (192 answers). The routing bench's TTFT
ratios did not get worse with it (docs/benchmarks.md, issue 37)."""
RATE_DECAY = 0.5 ** (1 / RATE_HALF_LIFE_ANSWERS)


@dataclass
class _Load:
    role: str
    inflight: int = 0
    awaiting_decode: int = 0
    pending_tokens: int = 0
    """Prefill: prompt tokens it is expected to compute for the calls in flight there."""
    since: float = 0.0
    """Prefill: when it last answered with a result or became busy, whichever is later."""
    computed_tokens: float = 0.0
    computed_s: float = 0.0
    """Prefill: tokens of its answered calls and the time they took, each answer decayed by
    RATE_DECAY per later answer (module doc)."""
    answers: int = 0
    """Answers with a result (`Balancer.answered`)."""
    failures: int = 0
    """Failed calls in a row."""
    rests_until: float = 0.0

    def idle(self) -> bool:
        return self.inflight == 0 and self.awaiting_decode == 0

    def learn(self, tokens: int, took_s: float) -> None:
        """Prefill: an answered call computed `tokens` in `took_s` (module doc)."""
        self.computed_tokens = self.computed_tokens * RATE_DECAY + tokens
        self.computed_s = self.computed_s * RATE_DECAY + took_s

    def forget_rate(self) -> None:
        """Prefill: learn its rate again from its next answers."""
        self.computed_tokens = self.computed_s = 0.0

    def rate(self) -> float | None:
        """Prefill: tokens per second of its recent answers (None: none yet)."""
        return self.computed_tokens / self.computed_s if self.computed_s > 0 else None

    def left_tokens(self, now: float) -> float:
        """Prefill: tokens of the calls in flight it is expected to have left to compute (module doc)."""
        rate = self.rate()
        if rate is None:
            return self.pending_tokens
        return max(0.0, self.pending_tokens - rate * (now - self.since))


class Balancer:
    def __init__(self, clock: Callable[[], float] = time.monotonic, prefix: Mode = DEFAULT_MODE) -> None:
        self.membership: Membership | None = None
        self.prefix = PrefixRouter(prefix)
        self._loads: dict[str, _Load] = {}
        self._turn = dict.fromkeys(ROLES, 0)
        self._clock = clock

    @property
    def version(self) -> str | None:
        return self.membership.version if self.membership else None

    def members(self, role: str, layout: str | None = None) -> tuple[Upstream, ...]:
        """Members of `role` a request may use: those with a member of the other role on their KV
        layout (and on `layout` when given; a decode must run the layout its prefill ran)."""
        return self.membership.pairable(role, layout) if self.membership else ()

    def update(self, membership: Membership) -> None:
        """Route by `membership`; a prefill relisted on another URL or layout forgets its rate."""
        before = {u.name: u for u in self.listed("prefill")}
        self.membership = membership
        self.prefix.update(membership)
        for name, role in membership.names().items():
            self._loads.setdefault(name, _Load(role))
        for u in membership.prefill:
            old = before.get(u.name)
            if old is not None and (old.url, old.layout) != (u.url, u.layout):
                self._loads[u.name].forget_rate()
        self._drop_idle()

    def listed(self, role: str) -> tuple[Upstream, ...]:
        """Every member of `role`, paired or not."""
        return self.membership.role(role) if self.membership else ()

    def pick(self, role: str, tried: set[str], layout: str | None = None,
             prompt: Prompt | None = None) -> Upstream | None:
        """The member of `role` (on `layout` when given) that costs least, preferring members not yet
        `tried` for this request and, among those, members not resting; ties go round robin. None:
        the role has no such member. The cost: a prefill's prompt tokens to compute with `prompt`
        (module doc), then the requests in flight."""
        members = self.members(role, layout)
        fresh = [u for u in members if u.name not in tried] or list(members)
        if not fresh:
            return None
        now = self._clock()
        fresh = [u for u in fresh if self._load(u.name, role).rests_until <= now] or fresh
        if role == "prefill" and prompt is not None:
            hits = prompt.picked = self.prefix.hit_tokens(prompt, fresh)
            tokens = {u.name: len(prompt) - hits[u.name] + self._loads[u.name].left_tokens(now)
                      for u in fresh}
            cheapest = min(tokens.values())
            fresh = [u for u in fresh if tokens[u.name] == cheapest]
        least = min(self._load(u.name, role).inflight for u in fresh)
        tied = [u for u in fresh if self._loads[u.name].inflight == least]
        self._turn[role] += 1
        return tied[self._turn[role] % len(tied)]

    @contextmanager
    def serving(self, upstream: Upstream, role: str, prompt: Prompt | None = None) -> Iterator[None]:
        """Count a call to `upstream` as in flight for the duration of the block; a prefill of
        `prompt` also counts the tokens it is expected to compute there (with what it was expected to
        hold when `pick` chose it for `prompt`, not looked up again), and (approximate mode)
        leaves its blocks recorded there; when the member answers with a result during the call
        (`answered`), its rate counts them and the time they took."""
        load = self._load(upstream.name, role)
        tokens = 0
        if role == "prefill" and prompt is not None:
            picked, prompt.picked = prompt.picked, {}
            held = picked.get(upstream.name)
            if held is None:  # served where no pick scored it (a caller choosing the member itself)
                held = self.prefix.hit_tokens(prompt, [upstream])[upstream.name]
            tokens = len(prompt) - held
            self.prefix.routed(upstream, prompt)
        began, answers = self._clock(), load.answers
        if load.inflight == 0:
            load.since = began
        load.inflight += 1
        load.pending_tokens += tokens
        try:
            yield
        finally:
            load.inflight -= 1
            load.pending_tokens -= tokens
            if role == "prefill" and load.answers != answers:
                now = self._clock()
                load.learn(tokens, now - max(began, load.since))
                load.since = now
            self._drop_idle()

    def failed(self, upstream: Upstream, role: str) -> None:
        """A call to `upstream` failed: it rests before it is picked first again."""
        load = self._load(upstream.name, role)
        load.failures += 1
        load.rests_until = self._clock() + min(COOLDOWN_S * 2 ** (load.failures - 1), MAX_COOLDOWN_S)

    def answered(self, upstream: Upstream, role: str, computed: bool = True) -> None:
        """`upstream` answered (a result, or with `computed` False the client's own error, which may
        have computed nothing and so does not count in its rate): it is well."""
        load = self._load(upstream.name, role)
        load.failures, load.rests_until = 0, 0.0
        if computed:
            load.answers += 1

    def awaiting_decode(self, prefill: Upstream) -> Awaiting:
        """Count a finished prefill as holding blocks until `Awaiting.done()`."""
        load = self._load(prefill.name, "prefill")
        load.awaiting_decode += 1
        return Awaiting(self, load)

    def state(self) -> ProxyState:
        members = self.membership.names() if self.membership else {}
        return ProxyState(self.version, {
            name: UpstreamLoad(load.role, load.inflight, load.awaiting_decode, name in members)
            for name, load in self._loads.items()})

    def _load(self, name: str, role: str) -> _Load:
        return self._loads.setdefault(name, _Load(role))

    def _drop_idle(self) -> None:
        names = self.membership.names() if self.membership else {}
        for name in [n for n, load in self._loads.items() if n not in names and load.idle()]:
            del self._loads[name]


class Awaiting:
    """A prefill's blocks waiting for decode's first byte; `done()` is idempotent."""

    def __init__(self, balancer: Balancer, load: _Load) -> None:
        self._balancer, self._load, self._open = balancer, load, True

    def done(self) -> None:
        if self._open:
            self._open = False
            self._load.awaiting_decode -= 1
            self._balancer._drop_idle()

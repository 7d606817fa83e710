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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pd_operator.api.types import ROLES
from pd_operator.proxy.membership import Membership, ProxyState, Upstream, UpstreamLoad

COOLDOWN_S = 2.0
MAX_COOLDOWN_S = 30.0


@dataclass
class _Load:
    role: str
    inflight: int = 0
    awaiting_decode: int = 0
    failures: int = 0
    """Failed calls in a row."""
    rests_until: float = 0.0

    def idle(self) -> bool:
        return self.inflight == 0 and self.awaiting_decode == 0


class Balancer:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.membership: Membership | None = None
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
        self.membership = membership
        for name, role in membership.names().items():
            self._loads.setdefault(name, _Load(role))
        self._drop_idle()

    def listed(self, role: str) -> tuple[Upstream, ...]:
        """Every member of `role`, paired or not."""
        return self.membership.role(role) if self.membership else ()

    def pick(self, role: str, tried: set[str], layout: str | None = None) -> Upstream | None:
        """The member of `role` (on `layout` when given) with the fewest requests in flight,
        preferring members not yet `tried` for this request and, among those, members not resting;
        ties go round robin. None: the role has no such member."""
        members = self.members(role, layout)
        fresh = [u for u in members if u.name not in tried] or list(members)
        if not fresh:
            return None
        now = self._clock()
        fresh = [u for u in fresh if self._load(u.name, role).rests_until <= now] or fresh
        least = min(self._load(u.name, role).inflight for u in fresh)
        tied = [u for u in fresh if self._loads[u.name].inflight == least]
        self._turn[role] += 1
        return tied[self._turn[role] % len(tied)]

    @contextmanager
    def serving(self, upstream: Upstream, role: str) -> Iterator[None]:
        """Count a call to `upstream` as in flight for the duration of the block."""
        load = self._load(upstream.name, role)
        load.inflight += 1
        try:
            yield
        finally:
            load.inflight -= 1
            self._drop_idle()

    def failed(self, upstream: Upstream, role: str) -> None:
        """A call to `upstream` failed: it rests before it is picked first again."""
        load = self._load(upstream.name, role)
        load.failures += 1
        load.rests_until = self._clock() + min(COOLDOWN_S * 2 ** (load.failures - 1), MAX_COOLDOWN_S)

    def answered(self, upstream: Upstream, role: str) -> None:
        """`upstream` answered (a result or the client's own error): it is well."""
        load = self._load(upstream.name, role)
        load.failures, load.rests_until = 0, 0.0

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

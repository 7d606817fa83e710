"""Graceful scale-down: an instance the roles no longer want leaves the proxy first and goes only
once nothing still needs it. Pure: the reconcile passes what it observed and read.

Why: a decode instance deleted while it streams drops those requests; a prefill instance deleted
while a decode instance has still to pull a request's KV blocks from it breaks that transfer
(vllm-ascend keeps the blocks until decode pulled them or VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT
passed: vllm-project/vllm-ascend: vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py
@ v0.30.0rc2). So removal is two-phase:

1. The membership ConfigMap is rendered without the instance (render/proxy.py), and the instance's
   StatefulSet, headless Service and PodGroup are kept although the spec no longer wants them.
2. They are deleted when every live proxy pod answers its state (membership.STATE_PATH) with a
   membership that no longer lists the instance (so no new request can reach it; not necessarily
   the newest version: a proxy a later change has not reached yet has still let it go) and carries
   nothing more on it: decode, no request in flight; prefill, none in flight and none awaiting
   decode's pull. A prefill instance waits besides for every live decode pod's KV-link gate to
   report a membership without it (transfer/gate_state.py: the operator pushes the membership to
   the gates, whose mounted file follows up to a minute late): a gate that still links a deleted
   prefill fails its rounds, and its decode instance would leave the proxy. Or when the role's
   bound has passed since the drain began: decode spec.scaling.drain.decodeSeconds, prefill
   spec.kvTransfer.timeouts.abortRequestSeconds (after which prefill has freed the blocks anyway). A
   proxy pod or gate whose state cannot be read holds the drain until the bound: unknown is not
   idle (nothing listening there is nothing to wait for: no process runs to route or link).

The drain's start is kept in status.draining (`since`), the one record that survives an operator
restart; a lost status restarts the clock, which only waits longer. A drained instance is deleted
by the reconcile's prune; one that the roles want again before that simply stays.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from pd_operator.api.labels import INSTANCE, ROLE
from pd_operator.api.types import ROLES, DrainingStatus, RoleName
from pd_operator.controller.diff import is_owned_by
from pd_operator.controller.pods import is_terminating, label
from pd_operator.proxy.membership import ProxyState
from pd_operator.spec.validate import Resolved
from pd_operator.transfer.gate_state import GateState

RECHECK_S = 2.0
"""How soon the reconcile looks again while an instance drains (proxies learn a membership through
the API watch, gates from the operator's push; each reconcile pushes again to a gate behind)."""
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

Instance = tuple[RoleName, int]
"""(role, index)."""


@dataclass(frozen=True)
class ProxyRead:
    """One live proxy pod's answer at STATE_PATH, or why there is none."""

    pod: str
    state: ProxyState | None
    error: str = ""


@dataclass(frozen=True)
class GateRead:
    """One live decode pod's KV-link gate answer (after the operator's push), or why there is none."""

    pod: str
    state: GateState | None
    error: str = ""


@dataclass(frozen=True)
class Drain:
    name: str
    """The instance (its StatefulSet's name)."""
    role: RoleName
    index: int
    since: datetime
    deadline: datetime
    waiting_for: tuple[str, ...]
    """What still holds it (empty: nothing)."""
    timed_out: bool = False
    """It goes because its bound passed, not because nothing holds it."""

    @property
    def done(self) -> bool:
        return not self.waiting_for

    def status(self) -> dict:
        """Its entry in status.draining."""
        return DrainingStatus(name=self.name, role=self.role, since=self.since.strftime(TIME_FORMAT),
                              delete_by=self.deadline.strftime(TIME_FORMAT),
                              waiting_for="; ".join(self.waiting_for)).to_wire()


def instance_of(obj: dict) -> Instance | None:
    index = label(obj, INSTANCE)
    for role in ROLES:
        if label(obj, ROLE) == role and index is not None and index.isdigit():
            return role, int(index)
    return None


def departing(children: Iterable[dict], owner_uid: str, members: Mapping[str, Collection[int]]
              ) -> dict[Instance, str]:
    """Instances with an owned, live StatefulSet that the indices to run (`members`, per role: the
    spec's and the rollout's surge) no longer include, by (role, index) -> the StatefulSet's name."""
    out = {}
    for obj in children:
        inst = instance_of(obj)
        if (obj["kind"] == "StatefulSet" and inst is not None and inst[1] not in members[inst[0]]
                and is_owned_by(obj, owner_uid) and not is_terminating(obj)):
            out[inst] = obj["metadata"]["name"]
    return out


def bound(resolved: Resolved, role: str) -> timedelta:
    dep = resolved.deployment
    if role == "decode":
        return timedelta(seconds=dep.spec.scaling.drain.decode_seconds)
    return timedelta(seconds=dep.spec.kv_transfer.timeouts.abort_request_seconds)


def _since(previous: Iterable[dict], name: str, now: datetime) -> datetime:
    for entry in previous:
        if entry.get("name") == name:
            try:
                return datetime.strptime(str(entry.get("since")), TIME_FORMAT).replace(tzinfo=now.tzinfo)
            except ValueError:
                break
    return now


def _load(name: str, role: str, read: ProxyRead) -> str | None:
    """What `read` says still holds instance `name` (None: nothing)."""
    if read.state is None:
        return f"proxy pod {read.pod}'s state cannot be read ({read.error})"
    if read.state.version is None:  # it loads a membership next, which may still list the instance
        return f"proxy pod {read.pod} has loaded no membership yet"
    load = read.state.upstreams.get(name)
    if load is None:
        return None
    held = [f"routes by membership {read.state.version}, which lists it"] if load.member else []
    held += [f"{load.inflight} in flight"] if load.inflight else []
    if role == "prefill" and load.awaiting_decode:
        held.append(f"{load.awaiting_decode} awaiting decode's KV pull")
    return f"{' and '.join(held)} through proxy pod {read.pod}" if held else None


def _linked(name: str, read: GateRead) -> str | None:
    """Whether the gate of `read` may still check prefill instance `name` (None: it will not)."""
    if read.state is None:
        return f"decode pod {read.pod}'s KV-link gate cannot be read ({read.error})"
    if name in read.state.members:
        return (f"decode pod {read.pod}'s KV-link gate links it "
                f"(membership {read.state.version or 'none: its configuration'})")
    return None


def drains(resolved: Resolved, leaving: dict[Instance, str], previous: Iterable[dict],
           reads: list[ProxyRead] | None, gates: list[GateRead], now: datetime) -> list[Drain]:
    """The drain of every departing instance. `reads` is None when no proxy routes to the instances
    (spec.proxy.enabled false): nothing of ours sends them requests. `gates`: every live decode
    pod's gate (held only by prefill instances)."""
    previous = list(previous)
    out = []
    for (role, index), name in sorted(leaving.items()):
        since = _since(previous, name, now)
        deadline = since + bound(resolved, role)
        waits: list[str] = []
        if now < deadline:
            waits = [w for read in reads or [] if (w := _load(name, role, read))]
            if role == "prefill":
                waits += [w for read in gates if (w := _linked(name, read))]
        could_hold = reads is not None or (role == "prefill" and bool(gates))
        out.append(Drain(name, role, index, since, deadline, tuple(waits),
                         timed_out=now >= deadline and could_hold))
    return out


def held(obj: dict, drains_: Iterable[Drain]) -> bool:
    """Whether a child the spec no longer wants belongs to an instance still draining."""
    inst = instance_of(obj)
    return inst is not None and any((d.role, d.index) == inst and not d.done for d in drains_)

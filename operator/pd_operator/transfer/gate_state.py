"""The KV-link gate's membership, verdict and state on its probe port: one home for the protocol a
decode pod's `pd-kv-probe gate` (probe_gate.py) and the operator (controller/proxy_state.py) speak.
Pure.

Why: a gate links the prefill instances the proxy routes to (render/kv_probe.py). It reads them from
the proxy's membership ConfigMap mounted as a file, which the kubelet re-projects up to about a minute
after the operator writes it (its sync period plus its ConfigMap cache), and engine pods mount no API
token, so the gate cannot watch the API as the proxy does. A drained prefill whose pods go while a
gate still reads the old file fails that gate's next round. So the operator also pushes each
membership document to the gate's probe port (POST MEMBERSHIP_PATH; the engines' NetworkPolicy admits
the operator's namespace there), and the answer is the gate's state (also GET STATE_PATH): the
membership version it applied, the prefill instances it links, its verdict and its last round. The
operator deletes a drained prefill's pods only once every gate reports a membership without it
(controller/drain.py).

Push and file carry one sequence of documents, the file later. `Targets` applies a push at once and a
file change only when it is news: a version pushed since the file last changed is the projection
catching up (that push and the ones before it are then consumed), so a late file never takes the gate
back to a membership the operator already replaced. A file version never pushed (a push that failed,
an operator restarted between its write and its push) is applied. And once PUSH_HOLDS_S have passed
since the last push, the file (projected by then) is the truth again: a gate a later push missed
comes back to the ConfigMap's membership however the versions went.

The verdict (`Verdict`): a peer absent from the membership applied when a round ends is not a peer (a
prefill that drained while the round checked it is no failure), and the gate is unready only after
FAILURE_THRESHOLD failed rounds in a row, or before its first linked round: one lost round does not
take a decode instance out of routing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pd_operator.proxy.membership import Membership
from pd_operator.spec.ports import PROBE_PORT

STATE_PATH = "/gate/state"
"""GET: the gate's state (state_document)."""
MEMBERSHIP_PATH = "/gate/membership"
"""POST a membership document (proxy/membership.py): the gate applies it and answers its state."""
FAILURE_THRESHOLD = 2
"""Failed rounds in a row before a linked gate reports unready."""
MAX_PUSH_BYTES = 1 << 20
"""The largest membership document the gate reads (an honest one is about 150 bytes an instance)."""
PUSHES_KEPT = 64
"""Pushes remembered for the file to catch up with: far more than a minute of membership changes."""
PUSH_HOLDS_S = 300.0
"""How long a push outranks an unchanged file: well past the kubelet's projection lag (its sync
period of a minute plus its ConfigMap cache), and the operator pushes again while a prefill drains."""


def endpoint(url: str) -> str:
    """The probe endpoint of the instance serving at `url`: its leader pod, on the probe port."""
    return f"{urlsplit(url).hostname}:{PROBE_PORT}"


@dataclass
class Targets:
    """The membership a gate links by: pushed by the operator or read from the mounted file."""

    layout: str | None = None
    """This pod's kv-layout hash: only the prefill members on it, or on one the membership pairs as
    it (`pairs`), are peers (None: every one)."""
    membership: Membership | None = None
    source: str = ""
    """Where `membership` came from: "operator" (a push) or "file"."""
    _pushed: deque[str] = field(default_factory=lambda: deque(maxlen=PUSHES_KEPT))
    _pushed_at: float = float("-inf")
    _file_version: str | None = None

    def pushed(self, membership: Membership, now: float) -> bool:
        """Apply a pushed document (`now`: a monotonic clock); whether the membership changed."""
        self._pushed.append(membership.version)
        self._pushed_at = now
        return self._apply(membership, "operator")

    def file_read(self, membership: Membership, now: float) -> bool:
        """Apply the mounted file's document if it is news, or once the last push is PUSH_HOLDS_S
        old (see the module doc); whether the membership changed."""
        news = membership.version != self._file_version
        self._file_version = membership.version
        if news and membership.version in self._pushed:  # the projection catching up
            while self._pushed.popleft() != membership.version:
                pass
            return False
        if not news and now - self._pushed_at < PUSH_HOLDS_S:
            return False
        return self._apply(membership, "file")

    def _apply(self, membership: Membership, source: str) -> bool:
        changed = self.membership is None or membership.version != self.membership.version
        self.membership, self.source = membership, source
        return changed

    def members(self) -> dict[str, str]:
        """The prefill instances this gate links, by name -> probe endpoint."""
        if self.membership is None:
            return {}
        paired = self.membership.paired
        return {u.name: endpoint(u.url) for u in self.membership.prefill
                if self.layout is None or paired(u.layout) == paired(self.layout)}


@dataclass
class Verdict:
    """The gate's readiness from its rounds (see the module doc)."""

    failures: int = 0
    """Failed rounds in a row."""
    linked_once: bool = False
    last: dict | None = None

    @property
    def ready(self) -> bool:
        return self.linked_once and self.failures < FAILURE_THRESHOLD

    def record(self, round_: dict, peers: set[str] | None) -> dict:
        """Count one round, its results kept only for the endpoints in `peers` (the members when
        the round ended; None: every result counts). A round whose every result was dropped says
        nothing and changes nothing. Returns the round as counted."""
        results = round_["peers"]
        if peers is not None:
            kept = [r for r in results if r.get("peer") in peers]
            if results and not kept:
                return {**round_, "peers": [], "dropped": len(results)}
            round_ = {**round_, "ok": bool(kept) and all(r["ok"] for r in kept), "peers": kept,
                      **({"dropped": len(results) - len(kept)} if len(kept) < len(results) else {})}
        self.last = round_
        if round_["ok"]:
            self.failures, self.linked_once = 0, True
        else:
            self.failures += 1
        return round_


@dataclass(frozen=True)
class GateState:
    """A gate's answer at STATE_PATH or MEMBERSHIP_PATH."""

    version: str | None
    """The membership version it applied (None: none; it links the prefill instances of its
    configuration)."""
    members: tuple[str, ...]
    """The prefill instances it links (its next round checks exactly these)."""
    ready: bool
    failures: int
    round: dict | None
    """Its last counted round: ok, peers (each with peer, ok, latencyMs, gbps, errors), errors."""


def state_document(targets: Targets, verdict: Verdict, members: list[str]) -> dict:
    """The gate's state answer; `members`: the instances it links (Targets.members, or those of its
    configuration without a membership)."""
    return {"version": targets.membership.version if targets.membership else None,
            "source": targets.source or "config", "members": sorted(members),
            "ready": verdict.ready, "failures": verdict.failures, "round": verdict.last}


def parse_state(obj: Any) -> GateState:
    """A gate's state answer; ValueError naming the field when it is malformed (a decode pod runs the
    tenant's image, so whatever answers there is read as untrusted)."""
    if not isinstance(obj, dict):
        raise ValueError(f"the state is an object, not {type(obj).__name__}")
    version = obj.get("version")
    if version is not None and not isinstance(version, str):
        raise ValueError(f"version: a string or null, not {version!r}")
    members = obj.get("members")
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ValueError(f"members: a list of instance names, not {members!r}")
    ready, failures, round_ = obj.get("ready"), obj.get("failures"), obj.get("round")
    if not isinstance(ready, bool):
        raise ValueError(f"ready: true or false, not {ready!r}")
    if not isinstance(failures, int) or isinstance(failures, bool) or failures < 0:
        raise ValueError(f"failures: a count (int >= 0), not {failures!r}")
    if round_ is not None and not (isinstance(round_, dict) and isinstance(round_.get("peers"), list)):
        raise ValueError("round: an object with a list of peers, or null")
    return GateState(version, tuple(members), ready, failures, round_)

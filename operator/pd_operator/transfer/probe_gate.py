"""`pd-kv-probe gate`, the decode pod's readiness: check every prefill instance it may be paired with
each round, answer the readiness probe with its verdict, and on the same port take the operator's
membership pushes and serve its state (gate_state.py).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from pydantic import ValidationError

from pd_operator.api.types import PDDeployment
from pd_operator.names import Names
from pd_operator.proxy.membership import InstanceAddresses, Membership, parse_document, parse_text
from pd_operator.spec.ports import PROBE_PORT, PROBE_READY_PATH
from pd_operator.transfer.engine import EngineError
from pd_operator.transfer.gate_state import (
    MAX_PUSH_BYTES,
    MEMBERSHIP_PATH,
    STATE_PATH,
    Targets,
    Verdict,
    state_document,
)
from pd_operator.transfer.probe_check import Checker
from pd_operator.transfer.probe_input import InputError, engine, geometry, read_manifest
from pd_operator.transfer.probe_serve import json_server

RETRY_S = 5.0
"""After a failed round the next comes this soon (at most --every): a real outage is confirmed, and a
transient one forgotten, within seconds."""


def prefill_peers(doc: Any) -> dict[str, str]:
    """Every prefill instance of a PDDeployment manifest, by name -> its leader pod's probe endpoint."""
    meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    names = Names(meta.get("name", ""), meta.get("namespace") or "default")
    replicas = int((spec.get("prefill") or {}).get("replicas", 1))
    return {names.instance("prefill", i): f"{names.pod_host('prefill', i, 0)}:{PROBE_PORT}"
            for i in range(replicas)}


def read_membership(path: str) -> Membership:
    """The proxy's membership file."""
    try:
        return parse_document(read_manifest(path))
    except ValueError as err:
        raise InputError(f"{path}: {err}") from None


def addresses_of(config: str | None) -> InstanceAddresses | None:
    """The only upstreams a pushed membership may name: this deployment's instances at their
    addresses (None without --config: any)."""
    if not config:
        return None
    try:
        dep = PDDeployment.model_validate(read_manifest(config))
    except ValidationError as err:
        raise InputError(f"{config}: {err.errors()[0]['msg']}") from None
    return InstanceAddresses(Names(dep.name, dep.namespace), dep.spec.serving_port)


def gate_round(checker: Checker | None, peers: list[str], timeout: float, error: str | None = None) -> dict:
    """One round: linked only when there is a peer and every peer's check passed."""
    results = [checker.check(peer, timeout) for peer in peers] if checker else []
    errors = [error] if error else [] if peers else ["no prefill instance to link to"]
    return {"ok": bool(results) and all(r["ok"] for r in results), "peers": results, "errors": errors,
            "at": time.time()}


class Gate:
    """What the round loop and the HTTP handlers share, behind one lock: the membership it links by,
    its verdict, and a wake-up for a push that changed the membership."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.addresses = addresses_of(args.config)
        self.targets = Targets(layout=args.layout)
        self.verdict = Verdict(last={"ok": False, "peers": [], "errors": ["no check has run yet"]})
        self.configured: dict[str, str] = {}
        """Without a membership: every prefill instance of --peers-config or --config (or the --peer
        endpoints)."""
        self.lock = threading.Lock()
        self.wake = threading.Event()

    def _members(self) -> dict[str, str]:
        if self.args.peer:
            return {peer: peer for peer in self.args.peer}
        return self.targets.members() if self.targets.membership else self.configured

    def refresh(self) -> tuple[dict[str, str], str | None]:
        """Re-read the mounted file (or the config); the peers to check now and what could not be
        read (the last good reading stays: the kubelet replaces mounted files in place)."""
        error = None
        try:
            if self.args.membership:
                membership = read_membership(self.args.membership)
                with self.lock:
                    self.targets.file_read(membership, time.monotonic())
            elif not self.args.peer and self.targets.membership is None:
                configured = prefill_peers(read_manifest(self.args.peers_config or self.args.config))
                with self.lock:
                    self.configured = configured
        except InputError as err:
            error = str(err)
        with self.lock:
            return self._members(), error

    def record(self, round_: dict) -> dict:
        with self.lock:
            return self.verdict.record(round_, set(self._members().values()))

    def state(self) -> bytes:
        with self.lock:
            return json.dumps(state_document(self.targets, self.verdict, list(self._members()))).encode()

    def push(self, body: bytes) -> tuple[int, bytes]:
        try:
            membership = parse_text(body, self.addresses)
        except (ValueError, UnicodeDecodeError) as err:
            return 400, json.dumps({"error": f"not a membership of this deployment: {err}"[:1000]}).encode()
        with self.lock:
            if self.targets.pushed(membership, time.monotonic()):
                self.wake.set()
        return 200, self.state()

    def ready(self, only_ready: bool) -> tuple[int, bytes]:
        with self.lock:
            body = json.dumps(self.verdict.last).encode()
            return (200 if self.verdict.ready or not only_ready else 503), body


def cmd_gate(args: argparse.Namespace) -> int:
    geo = geometry(args)
    gate = Gate(args)
    gate.refresh()  # its state names the membership from the start
    routes = {PROBE_READY_PATH: lambda: gate.ready(True), "/link": lambda: gate.ready(False),
              STATE_PATH: lambda: (200, gate.state())}
    server = json_server(args.host, args.port, routes, {MEMBERSHIP_PATH: gate.push}, MAX_PUSH_BYTES)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    checker: Checker | None = None
    while True:
        gate.wake.clear()  # a push from here on wakes the next wait
        error = None
        if checker is None:
            try:
                checker = Checker(geo, engine(args))
            except EngineError as err:  # stay up and not ready: a restart would restart the group
                error = str(err)
        peers, unread = gate.refresh()
        counted = gate.record(gate_round(checker, list(peers.values()), args.timeout, error or unread))
        print(json.dumps(counted), flush=True)
        gate.wake.wait(args.every if counted["ok"] else min(args.every, RETRY_S))

"""`pd-kv-probe gate`, the decode pod's readiness: check every prefill instance it may be paired with
each round and answer the readiness probe with the last round.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from pd_operator.names import Names
from pd_operator.proxy.membership import parse_document
from pd_operator.spec.ports import PROBE_PORT, PROBE_READY_PATH
from pd_operator.transfer.engine import EngineError
from pd_operator.transfer.probe_check import Checker
from pd_operator.transfer.probe_input import InputError, engine, geometry, read_manifest
from pd_operator.transfer.probe_serve import json_server


def prefill_peers(doc: Any) -> list[str]:
    """The probe endpoint of every prefill instance's leader pod of a PDDeployment manifest."""
    meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    names = Names(meta.get("name", ""), meta.get("namespace") or "default")
    replicas = int((spec.get("prefill") or {}).get("replicas", 1))
    return [f"{names.pod_host('prefill', i, 0)}:{PROBE_PORT}" for i in range(replicas)]


def membership_peers(path: str, layout: str | None = None) -> list[str]:
    """The probe endpoint of every prefill instance the proxy's membership file lists (the hosts
    of its upstream URLs: the instances' leader pods); with `layout`, only those on that KV layout
    (the proxy pairs no others with this decode instance)."""
    try:
        members = parse_document(read_manifest(path))
    except ValueError as err:
        raise InputError(f"{path}: {err}") from None
    return [f"{urlsplit(u.url).hostname}:{PROBE_PORT}" for u in members.prefill
            if layout is None or u.layout == layout]


def gate_round(checker: Checker | None, peers: list[str], timeout: float, error: str | None = None) -> dict:
    """One round: linked only when there is a peer and every peer's check passed."""
    results = [checker.check(peer, timeout) for peer in peers] if checker else []
    errors = [error] if error else [] if peers else ["no prefill instance to link to"]
    return {"ok": bool(results) and all(r["ok"] for r in results), "peers": results, "errors": errors,
            "at": time.time()}


def cmd_gate(args: argparse.Namespace) -> int:
    geo = geometry(args)
    last: dict[str, Any] = {"ok": False, "peers": [], "errors": ["no check has run yet"]}
    lock = threading.Lock()

    def answer(ready_only: bool) -> tuple[int, bytes]:
        with lock:
            body = json.dumps(last).encode()
            return (200 if last["ok"] or not ready_only else 503), body

    routes = {PROBE_READY_PATH: lambda: answer(True), "/link": lambda: answer(False)}
    server = json_server(args.host, args.port, routes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    checker: Checker | None = None
    while True:
        error = None
        if checker is None:
            try:
                checker = Checker(geo, engine(args))
            except EngineError as err:  # stay up and not ready: a restart would restart the group
                error = str(err)
        try:
            peers = args.peer or (membership_peers(args.membership, args.layout) if args.membership
                                  else prefill_peers(read_manifest(args.config)))
        except InputError as err:  # the mounted config is replaced in place; keep the last peers
            peers, error = [], str(err)
        result = gate_round(checker, peers, args.timeout, error)
        with lock:
            last = result
        print(json.dumps(result), flush=True)
        time.sleep(args.every)

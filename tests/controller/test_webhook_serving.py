"""The admission webhook runs in a process of its own (controller/webhook.py Serving): it answers while
the reconcile side is stuck, a killed webhook process is restarted (its state in /healthz meanwhile),
and the process ends with the operator however the operator ends. The operator's own composition
(main.serving_webhook) serves real HTTPS reviews here."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from pd_operator.controller.main import options_from, serving_webhook
from pd_operator.controller.metrics import Metrics
from pd_operator.controller.runner import RECONCILE_WORKERS, Runner
from pd_operator.controller.webhook import REJECTED, WEBHOOK_ID, WebhookHealth
from support.specs import example

HANG_GUARD_S = 120  # only so that a regression fails instead of hanging; nothing is timed


class StuckClient:
    """Every reconcile's read of its PDDeployment waits until the test releases it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.all_stuck = threading.Event()
        self.stuck = 0
        self._lock = threading.Lock()

    def get_pddeployment(self, namespace: str, name: str) -> None:
        with self._lock:
            self.stuck += 1
            if self.stuck == RECONCILE_WORKERS:
                self.all_stuck.set()
        self.release.wait(HANG_GUARD_S)
        return None  # gone: the runner forgets it


def _until(condition: Any) -> None:
    """Wait for `condition` (polled; the guard only turns a regression into a failure)."""
    guard = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < guard, "waited in vain"
        threading.Event().wait(0.01)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _review(doc: dict, uid: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "CREATE", "object": doc}}


def _post(url: str, ca: bytes, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    context = ssl.create_default_context(cadata=ca.decode())
    try:
        with urllib.request.urlopen(request, context=context, timeout=HANG_GUARD_S) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as err:
        return err.code, {}


@pytest.fixture
def busy_loop():
    """An event loop on its own thread, standing for kopf's, which the test can block."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(HANG_GUARD_S)
    loop.close()


def test_admission_answers_while_every_reconcile_thread_and_kopfs_loop_are_blocked(tmp_path, monkeypatch,
                                                                                  busy_loop):
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    port = _free_port()
    options = options_from(["run", "--webhook-self-signed", f"--webhook-port={port}"])
    client, health = StuckClient(), WebhookHealth()
    runner = Runner(client, Metrics(), debounce_s=0.0)  # type: ignore[arg-type]
    url = f"https://127.0.0.1:{port}"
    loop_blocked = threading.Event()

    def block_the_loop() -> None:
        loop_blocked.set()
        client.release.wait(HANG_GUARD_S)

    try:
        with serving_webhook(options, tmp_path, health, runner) as serving:
            _until(lambda: health.ok)  # serving (no configuration to write without --webhook-config-name)
            # The reconcile side: a reconcile per thread of the pool, each stuck in its read ...
            for i in range(RECONCILE_WORKERS):
                busy_loop.call_soon_threadsafe(runner.poke, "bench", f"glm-{i}", "create", 0.0)
            assert client.all_stuck.wait(HANG_GUARD_S)
            # ... and the event loop the runner (and, in the operator, kopf) works in, blocked outright.
            busy_loop.call_soon_threadsafe(block_the_loop)
            assert loop_blocked.wait(HANG_GUARD_S)

            ca = serving.endpoint.cadata
            assert ca is not None
            status, allowed = _post(f"{url}/{WEBHOOK_ID}", ca, _review(example(), "uid-good"))
            assert status == 200 and allowed["kind"] == "AdmissionReview"
            assert allowed["response"]["uid"] == "uid-good" and allowed["response"]["allowed"] is True
            assert any(w.startswith("spec.decode.blockSize: ") for w in allowed["response"]["warnings"])

            bad = example("incompatible-glm-tp8-tp3.yaml")
            status, denied = _post(f"{url}/{WEBHOOK_ID}", ca, _review(bad, "uid-bad"))
            assert status == 200 and denied["response"]["allowed"] is False
            assert denied["response"]["status"]["code"] == REJECTED
            assert denied["response"]["status"]["message"].startswith("spec.decode.tensorParallelSize: ")

            assert _post(f"{url}/validate-something-else", ca, _review(bad, "uid-other"))[0] == 404
            assert _post(f"{url}/{WEBHOOK_ID}", ca, {"kind": "AdmissionReview"})[0] == 400
            # All of that was answered with the reconcile side still stuck.
            assert not client.release.is_set() and client.stuck == RECONCILE_WORKERS
    finally:
        client.release.set()
    with pytest.raises(ConnectionRefusedError):  # stopped: the port is closed when stop() returns
        socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
    asyncio.run_coroutine_threadsafe(runner.close(), busy_loop).result(HANG_GUARD_S)


class Recorded(WebhookHealth):
    """Every state the health went through, in order: (ok, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.states: list[tuple[bool, str]] = []

    def good(self, message: str) -> None:
        super().good(message)
        self.states.append((self.ok, message))

    def bad(self, message: str) -> None:
        super().bad(message)
        self.states.append((self.ok, message))


def test_a_killed_webhook_process_is_restarted_and_health_says_so_meanwhile(tmp_path, monkeypatch):
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    port = _free_port()
    health = Recorded()
    runner = Runner(None, Metrics())  # type: ignore[arg-type]  # the webhook reads only its settings
    options = options_from(["run", "--webhook-self-signed", f"--webhook-port={port}"])
    with serving_webhook(options, tmp_path, health, runner) as serving:
        _until(lambda: health.ok)
        first = serving.pid
        assert first is not None and first != os.getpid()
        os.kill(first, signal.SIGKILL)
        _until(lambda: health.failures == 1 and health.ok)
        assert serving.pid not in (None, first)
        exited = f"the webhook's process {first} exited (signal {signal.SIGKILL.value}); restarting it in 1 s"
        served = (True, f"serving at https://127.0.0.1:{port}")
        assert health.states == [served, (False, exited), served]
        assert serving.endpoint.cadata is not None
        status, answer = _post(f"https://127.0.0.1:{port}/{WEBHOOK_ID}", serving.endpoint.cadata,
                               _review(example(), "uid-after"))
        assert status == 200 and answer["response"]["allowed"] is True
    assert health.failures == 1  # stopping is no failure


OPERATOR = """
import pathlib, sys, tempfile, threading
from pd_operator.controller.main import options_from, serving_webhook
from pd_operator.controller.metrics import Metrics
from pd_operator.controller.runner import Runner
from pd_operator.controller.webhook import WebhookHealth

health = WebhookHealth()
options = options_from(["run", "--webhook-self-signed", f"--webhook-port={sys.argv[1]}"])
serving = serving_webhook(options, pathlib.Path(tempfile.mkdtemp()), health, Runner(None, Metrics()))
serving.start()
while not health.ok:
    threading.Event().wait(0.01)
print(serving.pid, flush=True)
threading.Event().wait()
"""


def test_the_webhook_process_ends_when_the_operator_is_killed(monkeypatch):
    """SIGKILL: no handler of the operator's runs, only its end of the pipe closes."""
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    port = _free_port()
    operator = subprocess.Popen([sys.executable, "-c", OPERATOR, str(port)], stdout=subprocess.PIPE,
                                text=True)
    try:
        assert operator.stdout is not None
        child = int(operator.stdout.readline())
        gone = os.pidfd_open(child)  # readable once the process has exited, whoever its parent is then
        try:
            socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S).close()  # it serves
            assert not select.select([gone], [], [], 0)[0]
            operator.kill()
            assert select.select([gone], [], [], HANG_GUARD_S)[0], "the webhook process outlived the operator"
        finally:
            os.close(gone)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
    finally:
        operator.kill()
        operator.wait()

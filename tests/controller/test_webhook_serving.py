"""The admission webhook answers while the reconcile side is stuck: it runs on a thread and event loop
of its own (controller/webhook.py Serving), so neither kopf's loop nor the reconciles' threads stand
between the API server and the verdict. The operator's own composition (main.serving_webhook) serves
real HTTPS reviews here while every reconcile thread waits in a reconcile's read and the loop the
runner works in (kopf's, in the operator) is blocked outright."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
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
        with serving_webhook(options, tmp_path, client, health, runner) as serving:  # type: ignore[arg-type]
            while not health.ok:  # serving (no configuration to write without --webhook-config-name)
                threading.Event().wait(0.01)
            # The reconcile side: a reconcile per thread of the pool, each stuck in its read ...
            for i in range(RECONCILE_WORKERS):
                busy_loop.call_soon_threadsafe(runner.poke, "bench", f"glm-{i}", "create", 0.0)
            assert client.all_stuck.wait(HANG_GUARD_S)
            # ... and the event loop the runner (and, in the operator, kopf) works in, blocked outright.
            busy_loop.call_soon_threadsafe(block_the_loop)
            assert loop_blocked.wait(HANG_GUARD_S)

            ca = serving.server.cadata
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

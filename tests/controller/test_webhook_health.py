"""/healthz says the webhook is ok only once the API server would call it: serving, and its URL
and CA written into the ValidatingWebhookConfiguration (a test that waits for "ok" and then reads
the configuration must find it there)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf

from pd_operator.controller.webhook import Configurator, WebhookHealth, WebhookServer

CLIENT_CONFIG = {"url": "https://127.0.0.1:9443", "caBundle": "Q0E="}


class SlowClient:
    """Writes the configuration only when the test lets it."""

    def __init__(self) -> None:
        self.proceed = threading.Event()
        self.written: list[tuple[str, list[dict[str, Any]]]] = []

    def set_webhooks(self, name: str, hooks: list[dict[str, Any]]) -> None:
        self.proceed.wait(timeout=60)
        self.written.append((name, hooks))


async def _serving_then_configured(monkeypatch) -> None:
    async def serves(self, fn):  # kopf's server, reduced to "now serving at this address"
        yield dict(CLIENT_CONFIG)
        await asyncio.Event().wait()

    monkeypatch.setattr(kopf.WebhookServer, "__call__", serves)
    health, client = WebhookHealth(), SlowClient()
    server = WebhookServer(health=health, configurator=Configurator(client, "pd-operator", (), health))
    served = server(lambda **_: None)
    assert await anext(served) == CLIENT_CONFIG
    # Serving, configuration not written yet: not ok, and not a failure either.
    assert not health.ok and health.failures == 0 and "configuring" in health.message
    client.proceed.set()
    while not health.ok:
        await asyncio.sleep(0.01)
    assert client.written and client.written[0][1][0]["clientConfig"]["url"].startswith(CLIENT_CONFIG["url"])
    await served.aclose()


def test_the_webhook_is_ok_only_once_its_configuration_is_written(monkeypatch):
    asyncio.run(_serving_then_configured(monkeypatch))

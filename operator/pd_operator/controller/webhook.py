"""The admission webhook's server and, when self-signed, its ValidatingWebhookConfiguration.

The webhook runs on a thread and event loop of its own (`Serving`), not kopf's: on kopf's loop a
review waited behind kopf's processing of every watch event and the reconciles' bookkeeping, so
admission slowed down exactly when many PDDeployments were created at once. kopf's admission
machinery is not used at all: the one validator (render/runnable.py, through admission.py)
answers each review directly; only kopf's server class is kept (TLS, certificate reloads).

Server and configuration are supervised so that a webhook problem never stops reconciling (kopf
ended the whole operator when its webhook server or its configuration manager, kopf's
`settings.admission.managed`, failed; the operator uses neither). `WebhookServer` here retries its
own failures (a port in use, a certificate it cannot read) and, once it serves, writes its URL and
CA into the configuration the Helm chart created, retrying a refused write (RBAC, a configuration
that is missing). The state is in the operator's health (`/healthz` under "webhook") and its log.

kopf's manager also created a MutatingWebhookConfiguration of the same name (kopf 1.45:
_core/engines/admission.py runs a validating and a mutating manager), which the chart does not
grant and the operator does not need; and it named webhooks `<handler id>.<configuration name>`,
which the API server refuses unless that makes three dot-separated segments.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import socket
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import kopf

from pd_operator.api.labels import NAMESPACE_NAME
from pd_operator.api.types import GROUP, PLURAL, VERSION
from pd_operator.controller import certs
from pd_operator.controller.admission import Verdict
from pd_operator.controller.client import ApiError, Client

WEBHOOK_ID = "validate-pddeployment"
"""The URL path of the webhook (the chart's cert-manager configuration points at it)."""
WEBHOOK_NAME = f"validate.{PLURAL}.{GROUP}"
"""The webhook's name in its configuration: a domain with at least three segments, as the API
server requires (k8s.io/kubernetes: pkg/apis/admissionregistration/validation @ v1.36.3)."""
TIMEOUT_S = 30
"""The API server waits this long for a review (its maximum) before failing the write closed."""
RETRY_DELAYS = (1, 2, 5, 10, 30, 60)
REJECTED = 422
"""The status code of a rejected PDDeployment: the API server passes it on to the client."""
HINTS = {403: " (the operator's RBAC must allow patching it)",
         404: " (the Helm chart creates it; install the chart or create it)"}

# The API server stores objects up to ~1.5 MiB (etcd's request limit) and an UPDATE review carries
# the object twice; aiohttp's default body limit of 1 MiB would answer such reviews 413.
MAX_REVIEW_BYTES = 8 * 1024 * 1024

logger = logging.getLogger(__name__)


def _delay(attempt: int) -> float:
    return RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]


@dataclass
class WebhookHealth:
    """What /healthz reports under "webhook": serving (and configured), or why not."""

    ok: bool = False
    message: str = "starting"
    failures: int = 0

    def good(self, message: str) -> None:
        if not self.ok or message != self.message:
            logger.info("Admission webhook: %s", message)
        self.ok, self.message = True, message

    def pending(self, message: str) -> None:
        """Not ok yet, and no failure: serving, the configuration not written yet."""
        logger.info("Admission webhook: %s", message)
        self.ok, self.message = False, message

    def bad(self, message: str) -> None:
        self.failures += 1
        logger.error("Admission webhook: %s", message)
        self.ok, self.message = False, message

    def report(self) -> dict[str, Any]:
        return {"ok": self.ok, "message": self.message, "failures": self.failures}


def webhooks(client_config: dict[str, Any], namespaces: Sequence[str]) -> list[dict[str, Any]]:
    """The one webhook of the self-signed configuration: PDDeployment CREATE and UPDATE, fail closed."""
    hook: dict[str, Any] = {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": TIMEOUT_S,
        "clientConfig": {**client_config, "url": f"{client_config['url'].rstrip('/')}/{WEBHOOK_ID}"},
        "rules": [{"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["CREATE", "UPDATE"],
                   "resources": [PLURAL], "scope": "Namespaced"}],
    }
    if namespaces:  # only what this operator serves; other namespaces may have their own operator
        hook["namespaceSelector"] = {"matchExpressions": [
            {"key": NAMESPACE_NAME, "operator": "In", "values": list(namespaces)}]}
    return [hook]


@dataclass
class Configurator:
    """Writes the served URL and CA into ValidatingWebhookConfiguration `name` until it succeeds."""

    client: Client
    name: str
    namespaces: Sequence[str]
    health: WebhookHealth
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    def configure(self, client_config: dict[str, Any]) -> None:
        """Replace any configuring still retrying with this (newer) client config."""
        if self._task is not None:
            self._task.cancel()
        self._task = asyncio.get_running_loop().create_task(self._configure(client_config))

    async def _configure(self, client_config: dict[str, Any]) -> None:
        attempt = 0
        while True:
            try:
                await asyncio.to_thread(self.client.set_webhooks, self.name,
                                        webhooks(client_config, self.namespaces))
                self.health.good(f"serving at {client_config['url']}, "
                                 f"configured in ValidatingWebhookConfiguration {self.name}")
                return
            except ApiError as err:
                hint = HINTS.get(err.status or 0, "")
                self.health.bad(f"cannot configure ValidatingWebhookConfiguration {self.name}: {err}{hint}; "
                                f"retrying in {_delay(attempt)} s. PDDeployments are not checked on "
                                f"admission until then; the operator still reports invalid specs in their "
                                f"status.")
            await asyncio.sleep(_delay(attempt))
            attempt += 1

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class WebhookServer(kopf.WebhookServer):
    """kopf's webhook server, supervised, configuring the API server, taking large reviews."""

    def __init__(self, *, health: WebhookHealth, configurator: Configurator | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.health = health
        self.configurator = configurator

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        attempt = 0
        try:
            while True:
                try:
                    async for client_config in super().__call__(fn):
                        attempt = 0
                        if self.configurator:
                            # ok only once the configuration is written (Configurator), so that
                            # "ok" means the API server calls us.
                            self.health.pending(f"serving at {client_config['url']}; configuring "
                                                f"ValidatingWebhookConfiguration {self.configurator.name}")
                            self.configurator.configure(dict(client_config))
                        else:
                            self.health.good(f"serving at {client_config['url']}")
                        yield client_config
                    return
                except Exception as err:  # kopf would stop the operator: report, retry, keep reconciling
                    self.health.bad(f"cannot serve on port {self.port}: {err}; "
                                    f"retrying in {_delay(attempt)} s")
                await asyncio.sleep(_delay(attempt))
                attempt += 1
        finally:
            if self.configurator:
                self.configurator.stop()

    @staticmethod
    async def _serve(fn, request):  # kopf 1.45 private API (pinned): (fn, aiohttp request)
        # kopf builds its aiohttp application without a body limit of its own: raise the limit on
        # each request before kopf reads it.
        return await kopf.WebhookServer._serve(fn, request.clone(client_max_size=MAX_REVIEW_BYTES))


def server(*, port: int, cert_dir: str | None, workdir: pathlib.Path, health: WebhookHealth,
           configurator: Configurator | None) -> WebhookServer:
    """With `cert_dir` (cert-manager's Secret) serve its certificate; else make a CA and a serving
    certificate for the pod IP and, with `configurator`, write them into the configuration."""
    if cert_dir:
        directory = pathlib.Path(cert_dir)
        return WebhookServer(health=health, addr="0.0.0.0", port=port, certfile=directory / "tls.crt",
                             pkeyfile=directory / "tls.key")
    # The API server reaches the pod by its IP (the chart sets POD_IP from the downward API).
    host = os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())
    ca = certs.self_signed(workdir, [host, "localhost", "127.0.0.1"])
    return WebhookServer(health=health, configurator=configurator,
                         addr="0.0.0.0", port=port, host=host, certfile=workdir / "tls.crt",
                         pkeyfile=workdir / "tls.key", cadata=ca)


VerdictFn = Callable[[dict, str], Verdict]
"""The verdict on a PDDeployment (the review's object) for an operation (CREATE, UPDATE)."""


def answer(review: dict[str, Any], verdict_of: VerdictFn) -> dict[str, Any]:
    """The AdmissionReview (admission.k8s.io/v1) answering `review`."""
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("object"), dict):
        raise aiohttp.web.HTTPBadRequest(reason="the AdmissionReview has no request.object")
    verdict = verdict_of(request["object"], request.get("operation") or "CREATE")
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": verdict.allowed}
    if verdict.warnings:
        response["warnings"] = verdict.warnings
    if not verdict.allowed:
        response["status"] = {"message": verdict.message, "code": REJECTED}
    return {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": response}


class Serving:
    """`server` answering reviews with `verdict_of`, on a thread and event loop of its own, from
    `start()` until `stop()` (or as a context manager): neither kopf's loop nor the reconciles'
    threads stand between the API server and the verdict (only the GIL, for the verdict's CPU)."""

    def __init__(self, server: WebhookServer, verdict_of: VerdictFn) -> None:
        self.server = server
        self.verdict_of = verdict_of
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name="webhook",
                                        daemon=True)
        self._running = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._thread.start()
        self._running.wait()

    def stop(self) -> None:
        """Stop serving (the port is closed when this returns) and configuring."""
        if self._loop is not None and self._task is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed since: already stopped
                self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join()

    def __enter__(self) -> Serving:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        self._running.set()
        try:
            async for _client_config in self.server(self._review):
                pass
        except asyncio.CancelledError:
            pass

    async def _review(self, request: Any, *, webhook: str | None = None, headers: Any = None,
                      sslpeer: Any = None) -> Any:
        """kopf's server calls this (kopf.WebhookFn, whose TypedDicts kopf does not export) with the
        review and the id from the URL path."""
        if webhook != WEBHOOK_ID:
            raise aiohttp.web.HTTPNotFound(reason=f"no webhook at /{webhook}; this one is /{WEBHOOK_ID}")
        # In the loop itself: this loop serves nothing else, and a thread would only wait for the GIL.
        return answer(request, self.verdict_of)

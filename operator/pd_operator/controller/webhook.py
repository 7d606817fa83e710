"""The admission webhook's server, in a process of its own, and, when self-signed, its
ValidatingWebhookConfiguration.

The webhook runs in a child process of the operator (`Serving`), so that nothing of the operator's
stands between the API server and the verdict: on kopf's loop a review waited behind kopf's
processing of every watch event, and on a thread of the operator's it waited for the GIL, which
the reconciles' threads and kopf's loop hold most of the time while many PDDeployments are created
at once (the verdict's own CPU, mostly cel-python evaluating the CRD's CEL rules, then took several
times its length). The operator starts the process, relays its state into /healthz, restarts it
when it exits, and ends it when it stops; the process ends when the operator is gone (its pipe to
the operator closes). kopf's admission machinery is not used at all: the one validator
(render/runnable.py, through admission.py) answers each review directly; only kopf's server class
is kept (TLS, certificate reloads).

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
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import aiohttp.web
import kopf

from pd_operator.api import schema_check
from pd_operator.api.labels import NAMESPACE_NAME
from pd_operator.api.types import GROUP, PLURAL, VERSION
from pd_operator.controller import certs, logs
from pd_operator.controller.admission import Verdict
from pd_operator.controller.client import ApiError, Client, connect

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


@dataclass(frozen=True)
class Endpoint:
    """What the webhook's process serves and configures (it crosses to the process: picklable)."""

    port: int
    certfile: str
    pkeyfile: str
    host: str | None = None
    """The address the configuration names (self-signed); None: cert-manager's configuration."""
    cadata: bytes | None = None
    config_name: str | None = None
    """The ValidatingWebhookConfiguration to write the URL and CA into; None: none."""
    namespaces: tuple[str, ...] = ()
    kubeconfig: str | None = None
    log_format: str = "plain"


def endpoint(*, port: int, cert_dir: str | None, workdir: pathlib.Path, config_name: str | None = None,
             namespaces: Sequence[str] = (), kubeconfig: str | None = None,
             log_format: str = "plain") -> Endpoint:
    """With `cert_dir` (cert-manager's Secret) serve its certificate; else make a CA and a serving
    certificate for the pod IP (once: a restarted process serves the same) and, with `config_name`,
    write them into that configuration."""
    if cert_dir:
        directory = pathlib.Path(cert_dir)
        return Endpoint(port, str(directory / "tls.crt"), str(directory / "tls.key"),
                        kubeconfig=kubeconfig, log_format=log_format)
    # The API server reaches the pod by its IP (the chart sets POD_IP from the downward API).
    host = os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())
    ca = certs.self_signed(workdir, [host, "localhost", "127.0.0.1"])
    return Endpoint(port, str(workdir / "tls.crt"), str(workdir / "tls.key"), host=host, cadata=ca,
                    config_name=config_name, namespaces=tuple(namespaces), kubeconfig=kubeconfig,
                    log_format=log_format)


def server(where: Endpoint, health: WebhookHealth) -> WebhookServer:
    """`where`'s server (in the webhook's process), configuring `where.config_name` when named."""
    configurator = (Configurator(connect(where.kubeconfig), where.config_name, where.namespaces, health)
                    if where.config_name else None)
    return WebhookServer(health=health, configurator=configurator, addr="0.0.0.0", port=where.port,
                         host=where.host, certfile=where.certfile, pkeyfile=where.pkeyfile,
                         cadata=where.cadata)


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


class _Relayed(WebhookHealth):
    """The webhook process's health: each change goes to the operator, whose WebhookHealth /healthz
    reports (and whose log says it)."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self._conn = conn

    def good(self, message: str) -> None:
        self._conn.send(("good", message))

    def pending(self, message: str) -> None:
        self._conn.send(("pending", message))

    def bad(self, message: str) -> None:
        self._conn.send(("bad", message))


RELAYED = {"good", "pending", "bad"}


def _reviewer(verdict_of: VerdictFn) -> Any:
    async def review(request: Any, *, webhook: str | None = None, headers: Any = None,
                     sslpeer: Any = None) -> Any:
        """kopf's server calls this (kopf.WebhookFn, whose TypedDicts kopf does not export) with the
        review and the id from the URL path."""
        if webhook != WEBHOOK_ID:
            raise aiohttp.web.HTTPNotFound(reason=f"no webhook at /{webhook}; this one is /{WEBHOOK_ID}")
        # In the loop itself: this process serves nothing else.
        return answer(request, verdict_of)
    return review


PROCESS = "from pd_operator.controller.webhook import process_main; process_main({fd})"
"""The webhook process's program: a fresh interpreter (not a fork: the operator has threads, whose
locks a forked child would inherit held; not multiprocessing's spawn, which runs the operator's
__main__ again), sent what to serve over the pipe `fd`."""


def process_main(fd: int) -> None:
    """The webhook's process: serve what the operator sends over `fd` until its end closes."""
    conn = Connection(fd)
    where, verdict_of = conn.recv()
    # Ctrl-C in a terminal reaches the whole process group: the operator decides when this ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logs.configure(where.log_format)
    schema_check.compile_rules()  # before it serves: no review pays for it
    asyncio.run(_serve(where, verdict_of, conn))


async def _serve(where: Endpoint, verdict_of: VerdictFn, conn: Connection) -> None:
    orphaned = asyncio.Event()
    # The operator sends nothing more: its end readable means closed, the operator gone (it stops
    # this process with SIGTERM).
    asyncio.get_running_loop().add_reader(conn.fileno(), orphaned.set)
    serving = asyncio.ensure_future(_drain(server(where, _Relayed(conn))(_reviewer(verdict_of))))
    await orphaned.wait()
    serving.cancel()


async def _drain(configs: AsyncIterator[Any]) -> None:
    async for _client_config in configs:
        pass


class Serving:
    """The webhook (`where`, answering with `verdict_of`) in a child process from `start()` until
    `stop()` (or as a context manager), its state in `health`: restarted when it exits (after
    RETRY_DELAYS, reset once it serves), and ending when the operator ends, however it ends."""

    def __init__(self, where: Endpoint, verdict_of: VerdictFn, health: WebhookHealth) -> None:
        self.endpoint = where
        self.verdict_of = verdict_of
        self.health = health
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="webhook", daemon=True)

    @property
    def pid(self) -> int | None:
        """The webhook process's id (None before the first start)."""
        process = self._process
        return None if process is None else process.pid

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (the process gone, its port closed, when this returns) and configuring."""
        with self._lock:
            self._stopping.set()
            process = self._process
        if process is not None:
            process.terminate()
            process.wait()
        self._thread.join()

    def __enter__(self) -> Serving:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _supervise(self) -> None:
        attempt = 0
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return
                ours, theirs = socket.socketpair()
                with theirs:  # the process holds the other end alone: closed when it ends
                    fd = theirs.fileno()
                    process = subprocess.Popen([sys.executable, "-P", "-c", PROCESS.format(fd=fd)],
                                               pass_fds=[fd])
                self._process = process
            with Connection(ours.detach()) as conn:
                served = self._relay(conn)
            process.wait()
            if self._stopping.is_set():
                return
            attempt = 0 if served else attempt + 1
            self.health.bad(f"the webhook's process {process.pid} exited ({_exit(process.returncode)}); "
                            f"restarting it in {_delay(attempt)} s")
            if self._stopping.wait(_delay(attempt)):
                return

    def _relay(self, conn: Connection) -> bool:
        """Send the process what to serve, then its health changes into `health` until it ends;
        whether it served."""
        served = False
        try:
            conn.send((self.endpoint, self.verdict_of))
            while True:
                change, message = conn.recv()
                if change in RELAYED:
                    getattr(self.health, change)(message)
                    served = served or change != "bad"
        except (EOFError, OSError):  # it ended (OSError: before it read what to serve)
            return served


def _exit(code: int | None) -> str:
    return f"signal {-code}" if code is not None and code < 0 else f"code {code}"

"""pd-proxy's membership from the API server: a watch of its own ConfigMap.

Why: the mounted file (proxy/membership.py) changes only when the kubelet projects the ConfigMap
again, up to its sync period plus its ConfigMap cache TTL after the operator's write (about a minute
by default); scale-up routing, drains and the removal of a failed instance all wait for it. A watch
gets the change as the API server sends the event. The file stays the fallback: the proxy reads it
when it has no API access (no ServiceAccount token, or not in a cluster), and when the watch has
been down for longer than the file can lag (FILE_LAG_S, server.py). Not sooner: the file may still
hold a version older than the one the watch applied last, and going back to it would route to an
instance the operator has seen leave the proxy and may be deleting (a rollout's drained prefill
whose KV decode then cannot pull).

Why aiohttp and no Kubernetes client: one object, two requests. A list of the one ConfigMap by field
selector (`metadata.name=<name>`) gives its content and a resourceVersion; a watch from there (with
bookmarks, so the resourceVersion stays recent) gives each change. RBAC allows both by resourceNames:
the API server takes the name of a list or watch from a `metadata.name` field selector (kubernetes/
kubernetes: staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go @ v1.36.3,
checked against kube-apiserver v1.36.3 in tests/proxy/test_watch.py), so the proxy's Role grants
get, list and watch on that one ConfigMap (render/proxy.py).

A watch ends when the API server closes it (timeoutSeconds), when its connection breaks, with an
ERROR event, or with an answer it cannot read (not JSON, nested too deeply, not an event); after an
ERROR (410 Gone: the resourceVersion was compacted) or a failure the proxy lists again, after a
capped exponential backoff while failures repeat. The token is read again on every connection: a
projected token is rotated by the kubelet (at 80% of its lifetime).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

log = logging.getLogger("pd_operator.proxy.watch")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where a pod's ServiceAccount token, the cluster CA and the pod's namespace are mounted."""
TOKEN, CA, NAMESPACE = "token", "ca.crt", "namespace"
HOST_ENV, PORT_ENV = "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"
"""What the kubelet sets in every container: the API server's in-cluster address."""
WATCH_TIMEOUT_S = 300
"""The server closes a watch after this; the proxy watches again from where it was."""
READ_SLACK_S = 30
"""A watch silent this long past its timeout is a dead connection."""
REQUEST_TIMEOUT_S = 10.0
MAX_EVENT_BYTES = 4 << 20
"""Above a ConfigMap's 1 MiB limit, with room for its JSON encoding and metadata."""
BACKOFF_S = (0.1, 10.0)
"""The first and the largest wait between failed attempts."""
FILE_LAG_S = 120.0
"""How far the mounted file can trail the API: the kubelet projects a changed ConfigMap at its next
pod sync (--sync-frequency, 1 min by default, plus jitter) from its watch-based cache
(kubernetes/website: content/en/docs/concepts/configuration/configmap.md, "Mounted ConfigMaps are
updated automatically"). A file read this long after the watch went down shows the ConfigMap as it
was at that moment or later, never older than what the watch applied."""

Changed = Callable[[bytes | None, str, str], None]
"""Called with (the key's value, None when the ConfigMap or key is missing; where it came from; why
it is missing)."""


class Unavailable(Exception):
    """The API is not reachable from here: the reason, for the log."""


class Expired(Exception):
    """The watch's resourceVersion is gone (410): list again."""


@dataclass(frozen=True)
class ApiAccess:
    """How the proxy reaches the API server: its in-cluster address and the pod's credentials."""

    server: str
    credentials: Path
    namespace: str

    @classmethod
    def in_cluster(cls, credentials: Path = SERVICE_ACCOUNT_DIR,
                   env: Mapping[str, str] = os.environ) -> ApiAccess:
        """The pod's access; Unavailable saying what is missing."""
        host, port = env.get(HOST_ENV), env.get(PORT_ENV)
        if not host or not port:
            raise Unavailable(f"{HOST_ENV} and {PORT_ENV} are not set (not in a cluster)")
        for name in (TOKEN, CA, NAMESPACE):
            if not (credentials / name).is_file():
                raise Unavailable(f"no ServiceAccount {name} at {credentials} (automountServiceAccountToken "
                                  "is false, or the pod has no ServiceAccount)")
        namespace = (credentials / NAMESPACE).read_text().strip()
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", credentials, namespace)

    def token(self) -> str:
        return (self.credentials / TOKEN).read_text().strip()

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.credentials / CA))


class ConfigMapWatch:
    """Follows one key of ConfigMap `name` in the pod's namespace, calling `changed` with its value
    on every list and every change; `live` while a watch runs on a fresh list."""

    def __init__(self, access: ApiAccess, name: str, key: str, changed: Changed, *,
                 timeout_s: int = WATCH_TIMEOUT_S, backoff_s: tuple[float, float] = BACKOFF_S,
                 file_lag_s: float = FILE_LAG_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.access, self.name, self.key, self.changed = access, name, key, changed
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.file_lag_s, self._clock = file_lag_s, clock
        self._live = False
        self._down_since: float | None = None
        """When a watch that had applied the ConfigMap went down (None: it is live, or never was)."""
        self.source = f"ConfigMap {access.namespace}/{name} (watched)"
        self._path = f"/api/v1/namespaces/{access.namespace}/configmaps"
        self._selector = urllib.parse.quote(f"metadata.name={name}")
        self._last_failure = ""

    @property
    def live(self) -> bool:
        return self._live

    @live.setter
    def live(self, value: bool) -> None:
        if self._live and not value:
            self._down_since = self._clock()
        elif value:
            self._down_since = None
        self._live = value

    def file_counts(self) -> bool:
        """Whether the mounted file may be routed by: the watch never applied the ConfigMap, or it
        has been down for longer than the file can lag behind the API (FILE_LAG_S)."""
        if self._live:
            return False
        return self._down_since is None or self._clock() - self._down_since >= self.file_lag_s

    async def run(self) -> None:
        """List and watch until cancelled."""
        delay = self.backoff_s[0]
        version: str | None = None
        while True:
            # `live` stays set across a watch the server ended and a relist after 410: what the
            # watch applied last is newer than the file in both cases.
            try:
                async with self._session() as session:
                    if version is None:
                        version = await self._list(session)
                    version = await self._watch(session, version)
                delay = self.backoff_s[0]  # the server ended a healthy watch: watch again at once
                continue
            except Expired as err:
                log.info("%s: %s; listing again", self.source, err)
                version, delay = None, self.backoff_s[0]
                continue
            except (Unavailable, aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
                self.live, version = False, None
                self._failed(err)
            except asyncio.CancelledError:
                self.live = False
                raise
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self.backoff_s[1])

    def _failed(self, err: Exception) -> None:
        why = f"{type(err).__name__}: {err}" if not isinstance(err, Unavailable) else str(err)
        # A failure that repeats (RBAC missing, the API server down) is logged once, not every retry.
        level = logging.DEBUG if why == self._last_failure else logging.WARNING
        log.log(level, "%s: %s; routing by what it applied last until the watch is back (the membership "
                "file counts after %.0f s down, once it cannot be older)", self.source, why, self.file_lag_s)
        self._last_failure = why

    def _session(self) -> aiohttp.ClientSession:
        """A session with the current token and CA (both may be rotated)."""
        try:
            headers = {"Authorization": f"Bearer {self.access.token()}", "Accept": "application/json"}
            context = self.access.ssl_context()
        except (OSError, ssl.SSLError) as err:
            raise Unavailable(f"the ServiceAccount credentials cannot be read: {err}") from err
        return aiohttp.ClientSession(self.access.server, headers=headers,
                                     connector=aiohttp.TCPConnector(ssl=context, limit=1))

    async def _list(self, session: aiohttp.ClientSession) -> str:
        """Apply the ConfigMap as it is now; the list's resourceVersion."""
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with session.get(f"{self._path}?fieldSelector={self._selector}", timeout=timeout) as resp:
            body = await resp.read()
            if resp.status >= 400:
                raise Unavailable(f"listing it answered HTTP {resp.status}: {_message(body)}")
            found = _json(body)
        items = found.get("items") or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ValueError("the list's items are not objects")
        self._apply(items[0] if items else None)
        self.live = True
        if self._last_failure:
            log.info("%s: the watch is back", self.source)
            self._last_failure = ""
        return _resource_version(found)

    async def _watch(self, session: aiohttp.ClientSession, version: str) -> str:
        """Apply each change until the server ends the watch; the last resourceVersion seen."""
        query = (f"fieldSelector={self._selector}&watch=1&allowWatchBookmarks=true"
                 f"&resourceVersion={version}&timeoutSeconds={self.timeout_s}")
        timeout = aiohttp.ClientTimeout(total=self.timeout_s + READ_SLACK_S, sock_connect=REQUEST_TIMEOUT_S)
        async with session.get(f"{self._path}?{query}", timeout=timeout) as resp:
            if resp.status == 410:
                raise Expired(f"resourceVersion {version} is too old")
            if resp.status >= 400:
                raise Unavailable(f"watching it answered HTTP {resp.status}: {_message(await resp.read())}")
            self.live = True
            async for line in _lines(resp.content):
                kind, obj = _event(line)
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired(str(obj.get("message") or "410 Gone"))
                    raise Unavailable(f"the watch ended with an error: {obj.get('message') or obj}")
                version = _resource_version(obj)
                if kind in ("ADDED", "MODIFIED"):
                    self._apply(obj)
                elif kind == "DELETED":
                    self._apply(None)
        return version

    def _apply(self, config_map: dict | None) -> None:
        if config_map is None:
            self.changed(None, self.source, "does not exist")
            return
        data = config_map.get("data") or {}
        value = data.get(self.key) if isinstance(data, dict) else None
        if value is not None and not isinstance(value, str):
            raise ValueError(f"data.{self.key} is not a string")
        self.changed(None if value is None else value.encode(), self.source,
                     f"has no key {self.key}" if value is None else "")


def configmap_watch(name: str | None, key: str, credentials: Path, changed: Changed) -> ConfigMapWatch | None:
    """The watch of ConfigMap `name` when the pod can reach the API (None: no name, or no access;
    the log says which)."""
    if not name:
        return None
    try:
        access = ApiAccess.in_cluster(credentials)
    except Unavailable as err:
        log.warning("membership from the file only, not from ConfigMap %s: %s", name, err)
        return None
    log.info("membership from ConfigMap %s/%s through %s, the file as the fallback", access.namespace, name,
             access.server)
    return ConfigMapWatch(access, name, key, changed)


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The watch's events, one JSON document a line (aiohttp's own line reader refuses lines over
    128 KiB; a ConfigMap may hold up to 1 MiB)."""
    pending = b""
    async for chunk in stream.iter_any():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if len(pending) > MAX_EVENT_BYTES:
            raise ValueError(f"a watch event over {MAX_EVENT_BYTES} bytes")
        for line in lines:
            if line.strip():
                yield line


def _json(text: bytes) -> dict:
    """A JSON object; ValueError for anything else (RecursionError too: it is an unreadable answer)."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError("an answer nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError(f"an answer that is not an object but {type(obj).__name__}")
    return obj


def _event(line: bytes) -> tuple[object, dict]:
    """A watch event's type and object."""
    event = _json(line)
    obj = event.get("object") or {}
    if not isinstance(obj, dict):
        raise ValueError("a watch event whose object is not an object")
    return event.get("type"), obj


def _resource_version(obj: dict) -> str:
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    if not isinstance(version, str) or not version:
        raise ValueError("an object without metadata.resourceVersion")
    return version


def _message(body: bytes) -> str:
    """A Status answer's message, else the body's start."""
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")

"""Reading kube-apiserver's audit log (JSON lines, one event per request stage).

The control plane's policy logs every request at Metadata level without the RequestReceived stage,
so each request appears once as ResponseComplete (watches also once as ResponseStarted). Every
event names the user, verb, resource and response code:

    mark = cp.audit.mark()                      # remember where the log ends now
    ...                                         # do things
    events = cp.audit.events(since=mark, user=service_account_user("pd-system", "pd-operator"))
    assert not cp.audit.forbidden(mark, user=...)   # RBAC refused nothing
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    raw: dict[str, Any]

    @property
    def user(self) -> str:
        return str(self.raw.get("user", {}).get("username", ""))

    @property
    def verb(self) -> str:
        """get, list, watch, create, update, patch, delete, deletecollection."""
        return str(self.raw.get("verb", ""))

    @property
    def resource(self) -> str:
        """The plural, with the subresource after a slash (pods/status); empty for non-resource URLs."""
        ref = self.raw.get("objectRef") or {}
        resource = ref.get("resource", "")
        return f"{resource}/{ref['subresource']}" if ref.get("subresource") else str(resource)

    @property
    def group(self) -> str:
        return str((self.raw.get("objectRef") or {}).get("apiGroup", ""))

    @property
    def namespace(self) -> str:
        return str((self.raw.get("objectRef") or {}).get("namespace", ""))

    @property
    def name(self) -> str:
        return str((self.raw.get("objectRef") or {}).get("name", ""))

    @property
    def code(self) -> int:
        return int((self.raw.get("responseStatus") or {}).get("code", 0))

    @property
    def stage(self) -> str:
        return str(self.raw.get("stage", ""))

    @property
    def decision(self) -> str:
        """The authorizer's verdict: allow or forbid (empty for requests never authorized)."""
        return str((self.raw.get("annotations") or {}).get("authorization.k8s.io/decision", ""))

    @property
    def write(self) -> bool:
        return self.verb in ("create", "update", "patch", "delete", "deletecollection")

    def __str__(self) -> str:
        where = "/".join(p for p in (self.namespace, self.name) if p)
        return f"{self.user} {self.verb} {self.group}/{self.resource} {where} -> {self.code}"


class AuditLog:
    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def mark(self) -> int:
        """The log's current end: pass as `since` to read only what happens after now. The end of its
        last complete line: a size read while a line is being written can fall inside it (the kernel
        grows the file page by page), and that line is then counted as after the mark."""
        try:
            with self.path.open("rb") as f:
                size = f.seek(0, 2)
                start = max(0, size - (1 << 20))
                f.seek(start)
                tail = f.read(size - start)
        except FileNotFoundError:
            return 0
        return start + tail.rfind(b"\n") + 1

    def events(self, since: int = 0, *, user: str | None = None, verb: str | None = None,
               resource: str | None = None, namespace: str | None = None,
               stage: str = "ResponseComplete") -> list[Event]:
        """Events after byte offset `since`, filtered by what is given (`stage=""`: all stages)."""
        try:
            with self.path.open("rb") as f:
                f.seek(since)
                data = f.read()
        except FileNotFoundError:
            return []
        # The API server may be writing the last line right now: only complete lines count.
        lines = data[: data.rfind(b"\n") + 1].splitlines()
        found = []
        for line in lines:
            event = Event(json.loads(line))
            if stage and event.stage != stage:
                continue
            if (user is not None and event.user != user) or (verb is not None and event.verb != verb):
                continue
            if (resource is not None and event.resource != resource) or (
                    namespace is not None and event.namespace != namespace):
                continue
            found.append(event)
        return found

    def forbidden(self, since: int = 0, *, user: str | None = None) -> list[Event]:
        """Requests the authorizer (RBAC, Node) refused. Not every 403 is one: creating in a
        namespace being deleted is 403 too, after RBAC allowed it (its decision says allow)."""
        return [e for e in self.events(since, user=user) if e.decision == "forbid"]

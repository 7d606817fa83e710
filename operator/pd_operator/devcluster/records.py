"""The log of HTTP requests served, for tests that assert on API traffic (e.g. "no writes when idle")."""

from __future__ import annotations

import dataclasses

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclasses.dataclass
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    timestamp: float  # time.time() when the request arrived
    verb: str | None = None  # get/list/watch/create/update/patch/delete; None for discovery
    status: int | None = None  # None while in flight (e.g. an open watch) or when dropped
    fault: str | None = None  # the injected fault kind, if any


class RequestLog(list[RequestRecord]):
    """A plain list (appends are atomic under the GIL) with a few counting helpers."""

    def count_writes(self) -> int:
        return sum(1 for r in list(self) if r.method in WRITE_METHODS)

    def by_verb(self, verb: str) -> list[RequestRecord]:
        return [r for r in list(self) if r.verb == verb]

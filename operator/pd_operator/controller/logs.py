"""Operator logging: `plain` lines or one JSON object a line, naming the object a record is about.

kopf's per-object loggers put the object into `record.k8s_ref`; the reconcile's own records pass
`extra={"object": "ns/name"}`. Either becomes the `object` field.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


def _object(record: logging.LogRecord) -> str | None:
    ref = getattr(record, "k8s_ref", None)
    if isinstance(ref, dict) and ref.get("name"):
        return "/".join(p for p in (ref.get("namespace"), ref["name"]) if p)
    obj = getattr(record, "object", None)
    return obj if isinstance(obj, str) else None


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if (obj := _object(record)) is not None:
            out["object"] = obj
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj = _object(record)
        text = super().format(record)
        return f"{text} [{obj}]" if obj else text


def configure(fmt: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json"
                         else PlainFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("urllib3").setLevel(logging.WARNING)

"""Label and field selectors, parsed the way kube-apiserver parses ``?labelSelector=`` / ``?fieldSelector=``.

kmock 0.8 ignores both query parameters, so a filtered list/watch returned every object; operators that
rely on selectors (e.g. "pods of this StatefulSet") would then pass tests that fail on a real cluster.

Supported label syntax: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists),
``!k`` (does not exist), comma-separated (AND). The ``>``/``<`` forms are not supported.
Field selectors: ``metadata.name`` and ``metadata.namespace`` for every kind plus the few per-kind fields
the real server indexes (see ``FIELD_LABELS``); anything else is a 400, as on a real cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]

_REQUIREMENT = re.compile(
    r"""\s*(?:
        (?P<notexists>!\s*(?P<nkey>[^\s,=!()]+))
      | (?P<key>[^\s,=!()]+)\s*(?:
            (?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)
          | \s(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)
        )?
    )\s*(?:,|$)""",
    re.VERBOSE,
)

# Field labels indexed by the real API server, beyond metadata.name/metadata.namespace (by plural).
FIELD_LABELS: dict[str, set[str]] = {
    "pods": {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "status.phase", "status.podIP"},
    "events": {
        "involvedObject.kind",
        "involvedObject.name",
        "involvedObject.namespace",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "reason",
        "type",
        "source",
    },
    "secrets": {"type"},
    "namespaces": {"status.phase"},
}


class SelectorError(ValueError):
    """An unparsable or unsupported selector; the server answers 400 BadRequest."""


def parse_label_selector(text: str | None) -> Matcher:
    """Compile a label selector string into a predicate over an object's ``metadata.labels``."""
    if not text or not text.strip():
        return lambda obj: True
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    pos = 0
    while pos < len(text):
        m = _REQUIREMENT.match(text, pos)
        if not m or m.end() == pos:
            raise SelectorError(f"unable to parse requirement at {text[pos:]!r}")
        pos = m.end()
        checks.append(_requirement(m))
    return lambda obj: all(check(_labels(obj)) for check in checks)


def _requirement(m: re.Match[str]) -> Callable[[Mapping[str, str]], bool]:
    if m.group("notexists"):
        nkey = m.group("nkey")
        return lambda labels: nkey not in labels
    key, op, setop = m.group("key"), m.group("op"), m.group("setop")
    if op in ("=", "=="):
        value = m.group("value")
        return lambda labels: labels.get(key) == value
    if op == "!=":
        value = m.group("value")
        return lambda labels: labels.get(key) != value
    if setop:
        values = {v.strip() for v in m.group("values").split(",") if v.strip()}
        if setop == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    return lambda labels: key in labels


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def parse_field_selector(text: str | None, plural: str) -> Matcher:
    """Compile a field selector (``a.b=v,c!=w``) into a predicate; unsupported fields raise."""
    if not text or not text.strip():
        return lambda obj: True
    allowed = {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(plural, set())
    checks: list[Matcher] = []
    for term in text.split(","):
        m = re.fullmatch(r"\s*([\w.]+)\s*(==|=|!=)\s*(.*?)\s*", term)
        if not m:
            raise SelectorError(f"invalid field selector term {term!r}")
        path, op, value = m.groups()
        if path not in allowed:
            raise SelectorError(f'field label not supported: "{path}"')
        checks.append(_field_check(path.split("."), op == "!=", value))
    return lambda obj: all(check(obj) for check in checks)


def _field_check(path: list[str], negate: bool, value: str) -> Matcher:
    def check(obj: Mapping[str, Any]) -> bool:
        node: Any = obj
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        actual = "" if node is None else str(node)
        return (actual != value) if negate else (actual == value)

    return check

"""Condition types and reasons, and event reasons, are constants of api/conditions.py: the code spells
none of them as a literal, and every reason it gives is one of those constants (or a finding code)."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path

from pd_operator.api import conditions
from pd_operator.controller import events
from pd_operator.controller.drain import Drain
from pd_operator.findings import CATALOG

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "pd_operator"
BUILDERS = {"_Cond": (0, 2), "post_event": (2,), "Condition": ()}
"""Callables taking a condition type or reason: the positional arguments that are one."""
EVENT_TYPES = {"Normal", "Warning"}


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def literal_reasons(source: str) -> list[int]:
    """Lines where `source` spells a condition type, a condition reason or an event reason as a
    literal: an argument of a condition or event builder, a `type=`/`reason=` keyword, a `"reason"`
    key of a dict, the reason of a (type, reason, message) event tuple."""
    out = []
    for node in ast.walk(ast.parse(source)):
        suspects: list[ast.AST | None] = []
        if isinstance(node, ast.Call):
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")
            if name in BUILDERS:
                suspects += [node.args[i] for i in BUILDERS[name] if i < len(node.args)]
                suspects += [k.value for k in node.keywords if k.arg in ("type", "reason")]
        elif isinstance(node, ast.Dict):
            suspects += [v for k, v in zip(node.keys, node.values, strict=True)
                         if isinstance(k, ast.Constant) and k.value == "reason"]
        elif isinstance(node, ast.Tuple) and len(node.elts) == 3:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in EVENT_TYPES:
                suspects.append(node.elts[1])
        out += [node.lineno for s in suspects if _literal(s)]
    return out


def test_no_module_spells_a_reason_as_a_literal():
    found = {str(path.relative_to(PACKAGE)): lines for path in sorted(PACKAGE.rglob("*.py"))
             if path != PACKAGE / "api" / "conditions.py" and (lines := literal_reasons(path.read_text()))}
    assert found == {}, "use the constants of api/conditions.py"


def test_the_check_finds_a_literal_reason():
    assert literal_reasons('_Cond(c.READY, True, "Serving", "m")') == [1]
    assert literal_reasons('_Cond("Ready", True, c.SERVING, "m")') == [1]
    assert literal_reasons('client.post_event(body, "Normal", f"Replaced{x}", "m")') == [1]
    assert literal_reasons('x = {"type": T, "reason": "Drained"}') == [1]
    assert literal_reasons('def f():\n    return ("Warning", "DrainTimedOut", "m")') == [2]
    assert literal_reasons('_Cond(c.READY, True, c.SERVING, "Serving")') == []


def test_reason_constants_are_distinct_camel_case_words():
    names = [n for n in dir(conditions) if n.isupper() and isinstance(getattr(conditions, n), str)]
    for name in names:
        value = getattr(conditions, name)
        if value.startswith("<"):
            continue  # a placeholder of the docs table
        assert value.isalnum() and value[0].isupper(), name
    reasons = conditions.CONDITION_REASONS | conditions.EVENT_REASONS
    assert not set(conditions.TYPES) & reasons


def test_event_reasons_are_the_constants():
    since = datetime(2026, 1, 1, tzinfo=UTC)
    for timed_out in (False, True):
        d = Drain("x-decode-1", "decode", 1, since, since, (), timed_out)
        for type_, reason, message in (events.replaced(d, ["a"], "b", 30), events.deleted(d, 30)):
            assert type_ in EVENT_TYPES and reason in conditions.EVENT_REASONS and "x-decode-1" in message


def test_transitions_post_the_conditions_reasons():
    for reason in (*events.SIGNIFICANT, *events.STOPPED, *events.STARTING):
        assert reason in {*conditions.TYPES, *conditions.CONDITION_REASONS}


def test_a_finding_code_is_no_reason_constant_by_accident():
    """A condition copies a finding code as its reason when the spec is invalid; the constants stay
    apart from the codes, InvalidSpec aside (the code of a manifest the schema refuses)."""
    reasons = conditions.CONDITION_REASONS | conditions.EVENT_REASONS
    assert reasons & set(CATALOG) == {conditions.INVALID_SPEC}

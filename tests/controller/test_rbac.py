"""permissions.RULES (with WEBHOOK_RULES) and the API requests of controller/client.py match exactly,
both ways.

The declarations are found statically (the `@needs(...)` decorators in client.py's source), and
client.py refuses at run time any request its method did not declare, so what the integration
tests exercise is what is declared here.
"""

from __future__ import annotations

import ast
import inspect

import pytest

from pd_operator.controller import client, permissions
from pd_operator.controller.permissions import RULES, WEBHOOK_RULES


def _rule_triples() -> set[tuple[str, str, str]]:
    return {(verb, group, resource) for rule in [*RULES, *WEBHOOK_RULES] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def _decorated_methods() -> dict[str, bool]:
    """Every method of Client that sends a request -> whether it carries @needs."""
    tree = ast.parse(inspect.getsource(client))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Client")
    out = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name == "_request":
            continue
        sends = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                    and c.func.attr == "_request" for c in ast.walk(fn))
        if sends:
            out[fn.name] = any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "needs"
                               for d in fn.decorator_list)
    return out


def test_every_requesting_method_declares_its_needs():
    methods = _decorated_methods()
    assert methods, "found no method sending requests: the AST walk is broken"
    assert all(methods.values()), [m for m, ok in methods.items() if not ok]
    assert set(methods) == set(permissions.DECLARED)


def test_rules_cover_every_declared_request():
    used = set().union(*permissions.DECLARED.values()) | permissions.FRAMEWORK
    missing = used - _rule_triples()
    assert not missing, f"add to permissions.RULES: {sorted(missing)}"


def test_every_rule_is_used():
    used = set().union(*permissions.DECLARED.values()) | permissions.FRAMEWORK
    unused = _rule_triples() - used
    assert not unused, f"permissions.RULES grants what the operator never does: {sorted(unused)}"


def test_undeclared_request_is_refused_before_it_is_sent(monkeypatch):
    monkeypatch.setattr(permissions, "DECLARED", dict(permissions.DECLARED))  # `sneaky` registers itself
    class Unused:
        def __getattr__(self, name):
            raise AssertionError("the request must not be sent")

    api = client.Client(Unused())  # type: ignore[arg-type]

    @permissions.needs(("get", "", "pods"))
    def sneaky() -> None:
        api._request("delete", "v1", "pods", "DELETE", "/api/v1/namespaces/x/pods/y")

    with pytest.raises(RuntimeError, match="undeclared API request"):
        sneaky()

"""Every label and annotation key the operator writes or selects on is a constant of api/labels.py: no
other module spells one as a literal (docstrings and comments may name them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pd_operator.api import labels

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "pd_operator"
HOME = PACKAGE / "api" / "labels.py"
KEY = re.compile(r"(?:[a-z0-9-]+\.)*(?:kubernetes\.io|k8s\.io|pd\.serving\.dev)/[A-Za-z0-9._-]+"
                 r"|controller-revision-hash")
"""A key under a Kubernetes or our own prefix, or the StatefulSet revision label (it has none)."""
API_VERSION = re.compile(r".*/v\d+(?:(?:alpha|beta)\d+)?")
"""`group/version` strings share the prefixes; they are no keys."""


def literal_keys(source: str) -> list[tuple[int, str]]:
    """(line, key) of every string literal in `source` that is a label or annotation key, docstrings
    and other bare string statements left out."""
    tree = ast.parse(source)
    bare = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare
            and KEY.fullmatch(node.value) and not API_VERSION.fullmatch(node.value)]


def test_no_module_spells_a_label_key_as_a_literal():
    found = {str(path.relative_to(PACKAGE)): keys for path in sorted(PACKAGE.rglob("*.py"))
             if path != HOME and (keys := literal_keys(path.read_text()))}
    assert found == {}, "use the constants of api/labels.py"


def test_the_check_finds_a_literal_key():
    assert literal_keys('x = {"app.kubernetes.io/name": NAME}') == [(1, "app.kubernetes.io/name")]
    assert literal_keys('s = {"key": "kubernetes.io/metadata.name"}') == [(1, "kubernetes.io/metadata.name")]
    assert literal_keys('p.get("controller-revision-hash")') == [(1, "controller-revision-hash")]
    assert literal_keys('"""The app.kubernetes.io/name label."""\nv = "scheduling.k8s.io/v1alpha2"') == []


def test_the_home_holds_every_key_the_check_knows():
    """The check's pattern is no dead letter: api/labels.py's own keys match it."""
    assert {key for _, key in literal_keys(HOME.read_text())} >= {
        labels.APP_NAME, labels.APP_INSTANCE, labels.COMPONENT, labels.PART_OF, labels.MANAGED_BY,
        labels.CONTROLLER_REVISION_HASH, labels.NAMESPACE_NAME, labels.POD_INDEX, labels.HOSTNAME}
    assert labels.REVISION != labels.CONTROLLER_REVISION_HASH

"""The package's import layering (issue 23): subpackages form a stack, every import goes down it.

Run it on its own to see the graph: `pytest tests/test_layout.py -p no:cacheprovider`. Every import is
read with `ast` (function-level ones too, and `TYPE_CHECKING` ones: a type that names an upper layer
is an upward dependency all the same); a module belongs to the subpackage it sits in, and a module
directly in pd_operator/ is a layer of its own.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "pd_operator"
# Lowest first; a layer may import only from layers before it (layers on one line are peers and
# may not import each other).
LAYERS: list[tuple[str, ...]] = [
    ("findings", "names", "api_model"),
    ("kv",),
    ("serving_image",),
    ("api",),
    ("spec",),
    ("proxy",),
    ("preflight",),
    ("render",),
    ("transfer",),
    ("controller",),
    ("tools", "cli", "__main__"),
]
RANK = {layer: rank for rank, peers in enumerate(LAYERS) for layer in peers}
# Imports the declared order does not allow yet (none). The test fails on any other upward import, and
# on an entry here that no longer exists (remove it when fixed).
KNOWN_UPWARD: set[str] = set()
MAX_TOP_LEVEL_MODULES = 6


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imported(path: Path) -> set[str]:
    """Absolute names of the pd_operator modules (or packages) `path` imports, anywhere in it."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            # `from pd_operator.render import pod` imports the module render/pod.py; `from x.y import f`
            # imports x.y.
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if _is_module(sub) else target)
    return {name for name in out if name == "pd_operator" or name.startswith("pd_operator.")}


def _layer(module: str) -> str | None:
    """The layer a pd_operator module belongs to (None for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _edges() -> dict[tuple[str, str], list[str]]:
    """(from layer, to layer) -> the `module -> module` imports that make that edge."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _module_name(path)
        for target in sorted(_imported(path)):
            a, b = _layer(source), _layer(target)
            if a and b and a != b:
                edges[(a, b)].append(f"{source} -> {target}")
    return dict(edges)


def _graph_text(edges: dict[tuple[str, str], list[str]]) -> str:
    out = []
    for layer in sorted({a for a, _ in edges} | {b for _, b in edges}, key=lambda n: (RANK.get(n, -1), n)):
        below = sorted({b for a, b in edges if a == layer}, key=lambda n: (RANK.get(n, -1), n))
        out.append(f"  {layer} (layer {RANK.get(layer, '?')}) -> {', '.join(below) or '-'}")
    return "\n".join(out)


def _cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """Strongly connected layer groups of more than one layer (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_belongs_to_a_declared_layer():
    layers = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
              if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert layers == set(RANK), (f"layers on disk but not declared: {sorted(layers - set(RANK))}; "
                                 f"declared but gone: {sorted(set(RANK) - layers)}")


def _allowed(edges: dict[tuple[str, str], list[str]]) -> dict[tuple[str, str], list[str]]:
    """The layer graph without the known upward imports."""
    kept = {edge: [line for line in lines if line not in KNOWN_UPWARD] for edge, lines in edges.items()}
    return {edge: lines for edge, lines in kept.items() if lines}


def test_no_import_cycle_between_modules():
    graph: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for target in _imported(path):
            graph[(_module_name(path), target)].append("")
    assert not _cycles(graph), _cycles(graph)


def test_no_import_cycle_between_subpackages():
    edges = _allowed(_edges())
    assert not _cycles(edges), f"cycles: {_cycles(edges)}\nlayer graph:\n{_graph_text(_edges())}"


def test_every_import_goes_down_the_layers():
    edges = _edges()
    upward = {line for (a, b), lines in edges.items() if RANK[b] >= RANK[a] for line in lines}
    assert not upward - KNOWN_UPWARD, ("imports that go up (or sideways) the layers:\n  "
                                       + "\n  ".join(sorted(upward - KNOWN_UPWARD))
                                       + f"\nlayer graph:\n{_graph_text(edges)}")
    assert not KNOWN_UPWARD - upward, f"fixed, remove from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - upward)}"


def test_few_modules_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


# The controller takes a validated spec as a `Resolved` (spec/validate.py), so none of its modules
# needs to assert that a validated deployment (or the validation) is there.
NOT_NONE_ASSERT = re.compile(
    r"^\s*assert\s+(?:[\w.]*deployment|dep|[\w.]*validation|[\w.]*resolved)\s+is\s+not\s+None", re.M)
VALIDATION_ASSERT = re.compile(r"^\s*assert\s+[\w.]*validation\b", re.M)


def test_the_controller_does_not_assert_a_validated_deployment_exists():
    found = [f"{path.relative_to(PACKAGE)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0).strip()}"
             for path in sorted((PACKAGE / "controller").rglob("*.py"))
             for text in [path.read_text()]
             for pattern in (NOT_NONE_ASSERT, VALIDATION_ASSERT)
             for m in pattern.finditer(text)]
    assert not found, found


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The import reader and the assert patterns see what they are meant to (relative, function-level
    and package imports; both assert forms)."""
    pkg = tmp_path / "pd_operator" / "render"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    module = pkg / "m.py"
    for name in ("controller", "tools"):
        (tmp_path / "pd_operator" / name).mkdir()
        (tmp_path / "pd_operator" / name / "__init__.py").write_text("")
    module.write_text("from ..controller import gate\nfrom . import m\nimport json\n"
                      "def f():\n    from pd_operator import tools\n    import pd_operator.kv.pages\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "pd_operator"
    try:
        assert _imported(module) == {"pd_operator.controller", "pd_operator.render.m", "pd_operator.tools",
                                     "pd_operator.kv.pages"}
    finally:
        PACKAGE = saved
    assert _cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}) == [["a", "b", "c"]]
    assert NOT_NONE_ASSERT.search("    assert dep is not None\n")
    assert NOT_NONE_ASSERT.search("    assert validation.deployment is not None, x\n")
    assert VALIDATION_ASSERT.search("        assert validation.ok\n")
    assert not NOT_NONE_ASSERT.search("    assert pod is not None\n")


def test_tests_reach_their_helpers_through_support_only():
    """No sys.path edits under tests/ but in tests/support, and nothing imported from a test directory."""
    tests = Path(__file__).resolve().parent
    files = [p for p in sorted(tests.rglob("*.py")) if tests / "support" not in p.parents]
    local = {p.stem for p in files}  # modules only pytest's own sys.path entries would make importable
    found = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and \
                    isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(f"{path.relative_to(tests)}:{node.lineno}: sys.path")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in local:
                found.append(f"{path.relative_to(tests)}:{node.lineno}: from {node.module} import")
            elif isinstance(node, ast.Import):
                found += [f"{path.relative_to(tests)}:{node.lineno}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] in local]
    assert not found, found


def test_test_modules_have_unique_names():
    """pytest imports test modules by their base name (the test directories are no packages), so two
    of one name in different tiers stop the whole run at collection."""
    tests = Path(__file__).resolve().parent
    by_name = defaultdict(list)
    for path in sorted(tests.rglob("test_*.py")):
        by_name[path.name].append(str(path.relative_to(tests)))
    assert not {name: paths for name, paths in by_name.items() if len(paths) > 1}


# One validator for pdctl, the webhook, the controller and the tests: render/runnable.py's `validate`
# (and `check`), which runs the spec's rules and then checks that every rendered container can run in
# its image. The spec's rules alone (spec/validate.py `spec_rules_only`) are reachable only from spec/,
# from that validator, and from their own test.
SPEC_ONLY = "spec_rules_only"
ROOT = PACKAGE.parents[1]
MAY_REACH_SPEC_ONLY = ("operator/pd_operator/spec/", "operator/pd_operator/render/runnable.py",
                       "tests/api/test_spec_rules_only.py")


def spec_only_uses(source: str) -> list[int]:
    """Lines of `source` that import or name the spec-only rules."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and any(a.name == SPEC_ONLY for a in node.names) \
                or isinstance(node, ast.Attribute) and node.attr == SPEC_ONLY \
                or isinstance(node, ast.Name) and node.id == SPEC_ONLY:
            out.append(node.lineno)
    return out


def test_only_spec_and_the_one_validator_call_the_spec_only_rules():
    files = [p for top in ("operator", "tests", "bench", "tools") for p in sorted((ROOT / top).rglob("*.py"))]
    found = {rel: lines for p in files
             if not (rel := str(p.relative_to(ROOT))).startswith(MAY_REACH_SPEC_ONLY)
             and (lines := spec_only_uses(p.read_text()))}
    assert found == {}, "validate through pd_operator.render.runnable (validate or check)"
    reached = {rel for p in files if (rel := str(p.relative_to(ROOT))).startswith(MAY_REACH_SPEC_ONLY)
               and spec_only_uses(p.read_text())}
    assert {"operator/pd_operator/render/runnable.py", "tests/api/test_spec_rules_only.py"} <= reached


def test_the_spec_only_check_finds_each_way_in():
    assert spec_only_uses("from pd_operator.spec.validate import spec_rules_only") == [1]
    assert spec_only_uses("from pd_operator.spec import validate as v\nv.spec_rules_only(doc)") == [2]
    assert spec_only_uses("from pd_operator.render.runnable import validate\nvalidate(doc)") == []

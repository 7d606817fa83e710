"""The wheel holds the product only: the pd_operator modules its entry points import (the
operator, pdctl, the KV-link probe), the model presets and the typing marker; no test, demo or
benchmark harness (no API-server emulator, no process launchers), and no module imports kmock.

Builds the wheel as a release would (`pip wheel . --no-deps`) and reads its file list.
"""

from __future__ import annotations

import ast
import configparser
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "pd_operator"
# Build-time generators beside the code they read, run by `make docs` / `make chart-sync` / `make
# verify` and by tests/docs and tests/chart; no entry point imports them. Moving them out of the
# package (to tools/) is still to do.
GENERATORS = {f"{PACKAGE}.tools", f"{PACKAGE}.tools.chart_sync", f"{PACKAGE}.tools.docs", f"{PACKAGE}.rbac"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # From a copy of what the build reads: setuptools reuses a build/ directory, and an editable
    # install leaves an egg-info behind, so an in-place build could hold files deleted since.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "operator", source / "operator",
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(out)],
                   check=True, capture_output=True, text=True)
    (path,) = out.glob("pd_operator-*.whl")
    return zipfile.ZipFile(path)


def _modules(wheel: zipfile.ZipFile) -> dict[str, str]:
    """Dotted module name -> source of every Python file in the wheel."""
    out = {}
    for name in wheel.namelist():
        if name.endswith(".py"):
            dotted = name[:-3].replace("/", ".").removesuffix(".__init__")
            out[dotted] = wheel.read(name).decode()
    return out


def _imports(module: str, source: str, modules: set[str], packages: set[str]) -> set[str]:
    """The pd_operator modules `module` imports, anywhere in its body (lazy imports included)."""
    found = set()
    package = module if module in packages else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            # `import a.b.c` loads a, a.b and a.b.c.
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return found & modules


def _entry_modules(wheel: zipfile.ZipFile) -> set[str]:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(entry_points).decode())
    return {target.split(":")[0].strip() for target in parser["console_scripts"].values()} | {
        f"{PACKAGE}.__main__"}


def test_the_wheel_holds_only_the_product(wheel):
    names = wheel.namelist()
    outside = [n for n in names if not n.startswith((f"{PACKAGE}/", f"{PACKAGE.replace('_', '-')}-"))
               and ".dist-info/" not in n]
    assert not outside, outside
    assert any(n.startswith(f"{PACKAGE}/kv/presets/") and n.endswith(".yaml") for n in names)
    assert f"{PACKAGE}/py.typed" in names
    assert not [n for n in names if "devcluster" in n]

    modules = _modules(wheel)
    packages = {n[: -len("/__init__.py")].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    entries = _entry_modules(wheel)
    reached, todo = set(), list(entries)
    while todo:
        module = todo.pop()
        if module in reached or module not in modules:
            continue
        reached.add(module)
        todo += _imports(module, modules[module], set(modules), packages)
    unused = sorted(set(modules) - reached - GENERATORS)
    print(f"wheel: {len(names)} files, {len(modules)} modules, {len(reached)} reached from {sorted(entries)}")
    assert not unused, f"modules no entry point imports (test or demo harness?): {unused}"


def test_no_product_module_imports_kmock(wheel):
    for module, source in _modules(wheel).items():
        for node in ast.walk(ast.parse(source)):
            imported = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(name.split(".")[0] == "kmock" for name in imported), module
    assert "kmock" not in (ROOT / "pyproject.toml").read_text()

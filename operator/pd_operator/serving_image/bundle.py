"""The tools bundle: `pd-preflight` and `pd-kv-probe` as plain Python files, delivered into serving pods
that need nothing of ours in their image (docs/images.md, "Delivery").

A stock vllm-ascend image has python3, vLLM and vllm-ascend, and so what vLLM depends on (pydantic,
numpy, pyyaml), and the Mooncake wheel; it has no pd_operator. So an init container of the operator
image (the tools image) runs `pd-bundle DIR`, which copies the modules the two commands import, with a
launcher each, into an emptyDir; the serving and probe containers run `python3 DIR/pd-preflight ...`
with the serving image's own interpreter. A launcher's directory is the first entry of sys.path, so
the bundle's pd_operator wins over one an image may have installed (images/vllm-ascend): every pod
runs the operator's own version of the checks.

What is copied is the import closure of ENTRY_POINTS within pd_operator (every `import` statement,
lazy ones included), read from the source rather than by importing it: a module that imported a
package outside STDLIB_AND_SERVING would fail in the serving image, and tests/serving_image check that
none does.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

import pd_operator

PACKAGE = "pd_operator"
ENTRY_POINTS = {"pd-preflight": "pd_operator.preflight.cli", "pd-kv-probe": "pd_operator.transfer.probe"}
"""Launcher name -> the module whose main() it runs (the console scripts of the same names)."""
SERVING_MODULES = frozenset({"pydantic", "numpy", "yaml", "mooncake"})
"""Top-level packages outside the standard library the bundle may import: vLLM's own requirements
(vllm: requirements/common.txt @ v0.34.0 lists pydantic>=2.12, numpy, pyyaml) and the Mooncake wheel
every vllm-ascend image installs (vllm-ascend: Dockerfile @ v0.30.0rc2, MOONCAKE_TAG)."""
MIN_PYTHON = (3, 11)
"""The oldest python3 the bundle runs on (pyproject's requires-python); vllm-ascend images have 3.12
(vllm-ascend: Dockerfile @ v0.21.0rc1 and later, the CANN `-py3.12` base)."""
MOUNT = "/opt/pd-tools"
"""Where serving pods mount the bundle's emptyDir."""
DATA = ("kv/presets/*.yaml",)
"""Package data the bundled modules read (pyproject's package-data)."""
COMMAND = "pd-bundle"
"""The console script of the operator image that writes the bundle (the init container's command)."""
LAUNCHER = "import sys\n\nfrom {module} import main\n\nsys.exit(main())\n"


def command(name: str) -> list[str]:
    """The argv prefix that runs launcher `name` with the image's own interpreter."""
    assert name in ENTRY_POINTS, name
    return ["python3", f"{MOUNT}/{name}"]


def _root() -> Path:
    return Path(pd_operator.__file__).resolve().parent


def _module_file(root: Path, module: str) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for path in (root / rel / "__init__.py", (root / rel).with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _imports(tree: ast.AST) -> Iterable[str]:
    """Every absolute module name an import statement names, `from a import b` also as `a.b` (b may be
    a submodule)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def closure(entries: Iterable[str] = ENTRY_POINTS.values(), root: Path | None = None) -> dict[str, Path]:
    """Module name -> source file of every pd_operator module the entries import, transitively, with
    the packages that contain them."""
    root = root or _root()
    found: dict[str, Path] = {}
    pending = list(entries)
    while pending:
        module = pending.pop()
        if module in found or not (module == PACKAGE or module.startswith(PACKAGE + ".")):
            continue
        path = _module_file(root, module)
        if path is None:
            continue  # `from pd_operator.x import name`: name is not a module
        found[module] = path
        parts = module.split(".")
        pending += [".".join(parts[:i]) for i in range(1, len(parts))]
        pending += list(_imports(ast.parse(path.read_text(), str(path))))
    return found


def foreign_imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Top-level package -> the bundled modules importing it, for every package outside pd_operator."""
    out: dict[str, set[str]] = {}
    for module, path in modules.items():
        for name in _imports(ast.parse(path.read_text(), str(path))):
            top = name.split(".")[0]
            if top != PACKAGE and top != "__future__":
                out.setdefault(top, set()).add(module)
    return out


def outside_the_serving_image(modules: dict[str, Path]) -> dict[str, set[str]]:
    """The foreign imports a serving image cannot satisfy: neither the standard library nor
    SERVING_MODULES."""
    allowed = set(sys.stdlib_module_names) | SERVING_MODULES
    return {top: users for top, users in foreign_imports(modules).items() if top not in allowed}


def files(root: Path | None = None) -> list[Path]:
    """Paths, relative to the package's parent directory, of everything the bundle holds."""
    root = root or _root()
    out = {path.relative_to(root.parent) for path in closure(root=root).values()}
    for pattern in DATA:
        out |= {path.relative_to(root.parent) for path in root.glob(pattern)}
    return sorted(out)


def write(dest: Path, root: Path | None = None) -> list[Path]:
    """Lay the bundle out in `dest` (which may already hold an older one): the package files and a
    launcher per entry point. Returns the paths written, relative to dest."""
    root = root or _root()
    dest.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest / PACKAGE, ignore_errors=True)
    written = []
    for rel in files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root.parent / rel, target)
        written.append(rel)
    for name, module in ENTRY_POINTS.items():
        (dest / name).write_text(LAUNCHER.format(module=module))
        written.append(Path(name))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help=f"the directory to lay the bundle out in (pods: {MOUNT})")
    args = parser.parse_args(argv)
    try:
        written = write(args.dest)
    except OSError as err:
        print(f"{COMMAND}: cannot write the bundle to {args.dest}: {err}", file=sys.stderr)
        return 1
    print(f"{COMMAND}: pd-operator {pd_operator.__version__}: {len(written)} files in {args.dest} "
          f"({', '.join(ENTRY_POINTS)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

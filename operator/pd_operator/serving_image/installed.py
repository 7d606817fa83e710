"""What an installed vllm-ascend can really do, read from its source without importing it.

vllm-ascend needs torch_npu to import, and a version string says nothing about a build from a pull
request, so this reads the source tree instead: the connector registry
(`vllm_ascend/distributed/kv_transfer/__init__.py`, `register_connector`), whether
MooncakeConnectorV2's package defines the seed's `_compute_cross_tp_runs`, and which tracked model
families have model code. The same reading serves three callers:

- the pod's preflight: `check(claim, introspect(installed_root()))` before `vllm serve`;
- the serving image's build (images/vllm-ascend/Dockerfile): `python -m pd_operator.serving_image.installed
  ROOT --require-seed` fails the build when the vllm-ascend it built lacks the seed's functions;
- the contract tier (tests/contract), which runs it on every released source archive.

And it is what a pod reports of its image: the `pd-image-report` init container
(render/tools.py) writes `report()` as its termination message, which the kubelet copies into the
pod's status, where the operator reads it (`read_report`) into status.<role>.instances[].vllmAscend.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from pd_operator.findings import Finding
from pd_operator.serving_image.capabilities import (
    CONNECTOR_V2,
    GLM_NEXT,
    SEED_FUNCTION,
    SEED_PULL_REQUEST,
    ImageCapabilities,
)

REGISTRY = Path("vllm_ascend/distributed/kv_transfer/__init__.py")
FAMILY_CODE = {GLM_NEXT: Path("vllm_ascend/models/glm5next")}
COMMIT_FILE = Path("/opt/pd-operator/vllm-ascend.commit")
"""Written by the serving image's build: the vllm-ascend commit it was built from."""


@dataclass(frozen=True)
class Installed:
    """What introspect() found under one source root."""

    root: Path
    version: str | None
    commit: str | None
    connectors: dict[str, tuple[str, str]]
    """Registered name -> (module, class), as register_connector() registers them."""
    seed_change: bool
    families: frozenset[str]

    def describe(self) -> str:
        built = f" ({self.commit})" if self.commit else ""
        return f"vllm-ascend {self.version or '(unknown version)'}{built} at {self.root}"


def registered_connectors(root: Path) -> dict[str, tuple[str, str]]:
    """`KVConnectorFactory.register_connector(name, module, class)` calls with literal arguments."""
    path = root / REGISTRY
    if not path.is_file():
        return {}
    out = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "register_connector" and len(node.args) == 3
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)):
            name, module, cls = (a.value for a in node.args)  # type: ignore[attr-defined]
            out[name] = (module, cls)
    return out


def module_path(root: Path, module: str) -> Path:
    """The source file of a dotted module under root (a package's __init__.py, or module.py)."""
    base = root.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def defines(path: Path, name: str) -> bool:
    """Whether a Python file defines a function or class `name` at any depth (methods included)."""
    if not path.is_file():
        return False
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == name
               for n in ast.walk(tree))


def has_seed_change(root: Path, connectors: dict[str, tuple[str, str]]) -> bool:
    """The seed defines _compute_cross_tp_runs in MooncakeConnectorV2's package (PR #16755)."""
    if CONNECTOR_V2 not in connectors:
        return False
    package = module_path(root, connectors[CONNECTOR_V2][0]).parent
    return any(defines(path, SEED_FUNCTION) for path in sorted(package.rglob("*.py")))


def _version(root: Path) -> tuple[str | None, str | None]:
    """(version, commit) from the _version.py setuptools-scm writes at build time, else PKG-INFO."""
    path = root / "vllm_ascend" / "_version.py"
    text = path.read_text() if path.is_file() else ""
    version = re.search(r"^__version__ = version = ['\"]([^'\"]+)['\"]", text, re.M)
    commit = re.search(r"^__commit_id__ = commit_id = ['\"]([^'\"]+)['\"]", text, re.M)
    if version is None and (root / "PKG-INFO").is_file():
        version = re.search(r"^Version: (\S+)", (root / "PKG-INFO").read_text(), re.M)
    return (version.group(1) if version else None), (commit.group(1) if commit else None)


def introspect(root: Path, commit_file: Path = COMMIT_FILE) -> Installed:
    """Read the vllm-ascend source under `root` (the directory holding the vllm_ascend package)."""
    connectors = registered_connectors(root)
    version, commit = _version(root)
    if commit_file.is_file():
        commit = commit_file.read_text().strip() or commit
    families = frozenset(f for f, code in FAMILY_CODE.items() if (root / code).is_dir())
    return Installed(root, version, commit, connectors, has_seed_change(root, connectors), families)


REPORT_KEY = "vllmAscend"
REPORT_FIELD_CHARS = 64
"""The longest version or commit a report may carry: a pod's message is the tenant image's word,
kept short in the status."""


def report(found: Installed | None) -> str:
    """What a pod says of the vllm-ascend its image has, as one JSON object (under the kubelet's
    4096-byte termination message limit)."""
    if found is None:
        return json.dumps({REPORT_KEY: None})
    return json.dumps({REPORT_KEY: {"version": found.version, "commit": found.commit,
                                    "seedChange": found.seed_change}})


def read_report(message: object) -> str | None:
    """`report()`'s text as the status shows it (`0.30.0rc2 (commit 1a2b3c4d), seed change`), or
    None when `message` is not such a report. Read defensively: any container of the image may
    have written it."""
    if not isinstance(message, str) or len(message) > 4096:
        return None
    try:
        doc = json.loads(message)
    except ValueError:
        return None
    if not isinstance(doc, dict) or REPORT_KEY not in doc:
        return None
    found = doc[REPORT_KEY]
    if found is None:
        return "not installed"
    if not isinstance(found, dict):
        return None

    def field(name: str) -> str | None:
        value = found.get(name)
        if not isinstance(value, str) or not re.fullmatch(rf"[\w.+-]{{1,{REPORT_FIELD_CHARS}}}", value):
            return None
        return value

    version, commit = field("version") or "unknown version", field("commit")
    seed = "seed change" if found.get("seedChange") is True else "no seed change"
    return f"{version}{f' (commit {commit})' if commit else ''}, {seed}"


def installed_root() -> Path | None:
    """The directory holding the installed vllm_ascend package, located without importing it."""
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def _mismatch(path: str, message: str) -> Finding:
    return Finding("PreflightImageMismatch", "error", path, "", message)


def check(claim: ImageCapabilities, found: Installed) -> list[Finding]:
    """Where the installed vllm-ascend falls short of what the spec claimed of the image."""
    out = []
    if claim.seed_change and not found.seed_change:
        out.append(_mismatch("spec.image.seedChange",
                             f"spec.image claims the seed change (vllm-ascend PR #{SEED_PULL_REQUEST}), but "
                             f"{found.describe()} defines no {SEED_FUNCTION} in {CONNECTOR_V2}'s package; "
                             "use an image built from images/vllm-ascend or set seedChange: false."))
    for connector in claim.connectors:
        if connector not in found.connectors:
            out.append(_mismatch("spec.kvTransfer.connector",
                                 f"{found.describe()} does not register {connector}, which spec.image "
                                 f"(vllm-ascend {claim.vllm_ascend_version}) claims; correct "
                                 "spec.image.vllmAscendVersion or use that release's image."))
    for family in claim.families:
        if family not in found.families:
            out.append(_mismatch("spec.image.vllmAscendVersion",
                                 f"{found.describe()} has no {family} model code ({FAMILY_CODE[family]}), "
                                 f"which vllm-ascend {claim.vllm_ascend_version} has; correct "
                                 "spec.image.vllmAscendVersion or use that release's image."))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pd_operator.serving_image.installed",
        description="Report what a vllm-ascend source tree registers and whether it carries the seed "
                    f"change (vllm-ascend PR #{SEED_PULL_REQUEST}); exit 1 when a requirement is unmet.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("root", type=Path, nargs="?", help="directory holding the vllm_ascend package")
    where.add_argument("--installed", action="store_true",
                       help="read the vllm_ascend this Python would import (without importing it)")
    parser.add_argument("--require-seed", action="store_true",
                        help=f"fail unless {CONNECTOR_V2}'s package defines {SEED_FUNCTION}")
    args = parser.parse_args(argv)
    root = installed_root() if args.installed else args.root
    if root is None:
        print("error: no vllm_ascend package is importable here", file=sys.stderr)
        return 1
    found = introspect(root)
    print(f"{found.describe()}: connectors {', '.join(sorted(found.connectors)) or 'none'}; "
          f"seed change {'yes' if found.seed_change else 'no'}; "
          f"families {', '.join(sorted(found.families)) or 'none'}")
    missing = []
    if CONNECTOR_V2 not in found.connectors:
        missing.append(f"{CONNECTOR_V2} is not registered in {root / REGISTRY}")
    if args.require_seed and not found.seed_change:
        missing.append(f"no {SEED_FUNCTION} in {CONNECTOR_V2}'s package: this vllm-ascend lacks the "
                       f"seed change (PR #{SEED_PULL_REQUEST}); build from a ref that contains it")
    for reason in missing:
        print(f"error: {reason}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

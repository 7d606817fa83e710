"""The README stays a newcomer's page: short, with a code map naming every part of the package and
of the repository, and links that lead somewhere (issue 23 item 5)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "pd_operator"
README = (ROOT / "README.md").read_text()
# Top-level folders a newcomer meets; dot-folders, caches and build output are not code.
FOLDERS = ("crds", "charts", "images", "examples", "tests", "tests/support", "bench", "tools/testcluster",
           "docs")


def _code_map() -> str:
    return README.split("## Code map", 1)[1].split("\n## ", 1)[0]


def _first_cells(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", text, re.M)}


def test_readme_is_under_250_lines():
    assert len(README.splitlines()) < 250


def test_code_map_names_every_subpackage_and_top_level_module():
    named = _first_cells(_code_map())
    subpackages = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    modules = {p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert subpackages | modules <= named, sorted((subpackages | modules) - named)


def test_code_map_names_the_repository_folders():
    named = {cell.rstrip("/") for cell in _first_cells(_code_map())}
    for folder in FOLDERS:
        assert (ROOT / folder).is_dir(), folder
        assert any(n == folder or n.startswith(f"{folder}/") for n in named), folder


def test_code_map_paths_exist():
    for cell in _first_cells(_code_map()):
        path = cell.rstrip("/")
        assert (PACKAGE / path).exists() or (ROOT / path).exists(), cell


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+ (.+)$", markdown, re.M)}


def test_relative_links_in_readme_and_docs_resolve():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", doc.read_text()):
            if "://" in target:
                continue
            path = (doc.parent / target) if target else doc
            assert path.exists(), (doc.name, target)
            if anchor:
                assert anchor in _anchors(path.read_text()), (doc.name, target, anchor)

"""The README's finding and condition tables and docs/api.md say what the code says."""

from __future__ import annotations

import re
from pathlib import Path

from pd_operator.api.conditions import REASONS
from pd_operator.findings import CATALOG
from pd_operator.tools import docs

ROOT = Path(__file__).resolve().parents[2]


def test_readme_tables_equal_the_code():
    readme = (ROOT / "README.md").read_text()
    assert docs.fill(readme) == readme, "README tables are stale: run `make docs` and commit"
    for code in CATALOG:
        assert f"| `{code}` |" in readme, code
    for ctype, _, reason, _ in REASONS:
        assert re.search(rf"\| `{ctype}` \| \w+ \| `{re.escape(reason)}` \|", readme), (ctype, reason)


def test_api_reference_is_current():
    assert (ROOT / "docs" / "api.md").read_text() == docs.api_reference() + "\n", \
        "docs/api.md is stale: run `make docs` and commit"


def test_api_reference_documents_every_spec_section():
    text = docs.api_reference()
    for section in ("spec.model", "spec.kvTransfer", "spec.kvTransfer.timeouts", "spec.prefill",
                    "spec.decode", "spec.proxy", "spec.scaling", "spec.scaling.ratio", "status",
                    "status.conditions[]"):
        assert f"## `PDDeployment.{section}`" in text, section
    for section in ("spec", "status", "status.conditions[]"):
        assert f"## `PDRole.{section}`" in text, section

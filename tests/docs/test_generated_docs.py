"""The generated tables in docs/ and docs/api.md say what the code says."""

from __future__ import annotations

import re
from pathlib import Path

from pd_operator.api.conditions import EVENTS, REASONS
from pd_operator.findings import CATALOG
from pd_operator.tools import docs

ROOT = Path(__file__).resolve().parents[2]


def test_every_table_has_its_markers_in_its_home():
    for home, names in docs.homes().items():
        assert home.parts[0] == "docs", home
        assert docs.missing((ROOT / home).read_text(), names) == [], home


def test_generated_tables_equal_the_code():
    for home in docs.homes():
        text = (ROOT / home).read_text()
        assert docs.fill(text) == text, f"{home}: tables are stale: run `make docs` and commit"


def test_missing_markers_are_reported():
    text = (ROOT / "docs" / "status.md").read_text().replace("<!-- END conditions -->", "")
    assert docs.missing(text, ["findings", "conditions"]) == ["conditions"]


def test_status_tables_list_every_finding_and_condition_reason():
    status = (ROOT / "docs" / "status.md").read_text()
    for code in CATALOG:
        assert f"| `{code}` |" in status, code
    for ctype, _, reason, _ in REASONS:
        assert re.search(rf"\| `{ctype}` \| \w+ \| `{re.escape(reason)}` \|", status), (ctype, reason)
    for type_, reason, _ in EVENTS:
        assert f"| {type_} | `{reason}` |" in status, reason


def test_readme_has_no_generated_tables():
    """Generated tables live in docs/ only: the README's would go stale unchecked."""
    assert not re.search(r"<!-- BEGIN [\w-]+ -->", (ROOT / "README.md").read_text())


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

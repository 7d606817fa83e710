"""PDDeployment documents for tests: the examples as dicts, and the validator's Resolved for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pd_operator.spec.validate import Resolved, Validation, validate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def resolved_of(validation: Validation) -> Resolved:
    """The Resolved of a validation the test expects to be servable (fails the test otherwise)."""
    assert validation.resolved is not None, [f.line() for f in validation.findings]
    return validation.resolved


def resolve(doc: dict[str, Any]) -> Resolved:
    return resolved_of(validate(doc))

"""The prefill/decode pairing of a PDDeployment manifest, for tools that need only its KV side
(`pdctl plan FILE`, the KV-link probe). It reads the manifest through the one validator, so these
tools accept exactly what the webhook and the controller accept."""

from __future__ import annotations

from dataclasses import dataclass, field

from pd_operator.api.types import KVTransferSpec
from pd_operator.findings import Finding
from pd_operator.kv.side import Side
from pd_operator.spec.validate import validate

DEFAULT_CONNECTOR = KVTransferSpec.model_fields["connector"].default


class ManifestError(ValueError):
    """The manifest cannot be read as a pairing; the message names the fields."""


@dataclass(frozen=True)
class PairInput:
    prefill: Side
    decode: Side
    connector: str = DEFAULT_CONNECTOR
    findings: list[Finding] = field(default_factory=list)
    """Findings about the manifest other than the KV pair's own (ports, names, overrides)."""


def pair_from_manifest(doc: object) -> PairInput:
    result = validate(doc)
    if result.report is None or result.deployment is None:
        problems = result.errors or result.findings
        raise ManifestError("; ".join(f"{f.path}: {f.message}" if f.path else f.message for f in problems))
    kv_findings = set(result.report.findings)
    connector = result.deployment.spec.kv_transfer.connector
    return PairInput(result.report.prefill, result.report.decode, connector,
                     [f for f in result.findings if f not in kv_findings])

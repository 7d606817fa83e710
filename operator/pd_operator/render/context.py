"""Everything the renderer derives once from a successful validation, shared by every module."""

from __future__ import annotations

from dataclasses import dataclass

from pd_operator.api.types import ROLES, PDDeployment, RoleSpec
from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.model import ModelKV
from pd_operator.names import Names
from pd_operator.topology import PodPlan
from pd_operator.validate import Validation


class NotRenderable(ValueError):
    """render() was given a validation with error findings or without a resolved KV layout."""


@dataclass(frozen=True)
class Context:
    dep: PDDeployment
    model: ModelKV
    names: Names
    plans: dict[str, PodPlan]
    layouts: dict[str, SideLayout]

    @classmethod
    def of(cls, validation: Validation) -> Context:
        report, dep = validation.report, validation.deployment
        if not validation.ok or dep is None or validation.model is None or report is None:
            raise NotRenderable("only a validation without error findings and with a resolved model "
                                "can be rendered")
        if report.prefill_layout is None or report.decode_layout is None:
            raise NotRenderable("the KV layout of a role could not be resolved")
        return cls(dep, validation.model, Names(dep.name, dep.namespace), dict(validation.pod_plans),
                   {"prefill": report.prefill_layout, "decode": report.decode_layout})

    def role(self, role: str) -> RoleSpec:
        return self.dep.role(role)

    def engine_block_size(self, role: str) -> int:
        return self.layouts[role].engine_block_size

    def instances(self) -> list[tuple[str, int]]:
        """(role, index) of every engine instance, prefill first."""
        return [(role, i) for role in ROLES for i in range(self.role(role).replicas)]

    def pull_secrets(self) -> dict:
        """The pod spec's imagePullSecrets entry, or nothing."""
        secrets = self.dep.spec.image.pull_secrets
        return {"imagePullSecrets": [{"name": s} for s in secrets]} if secrets else {}

"""The PDRole of each role: the object `kubectl scale`, an HPA or KEDA scale the role through.

Why an object of its own: a role is many StatefulSets (one per instance), so no built-in object's
scale subresource is the role's instance count, and scaling the PDDeployment's spec would make the
scaler and whoever applies the PDDeployment fight over one field. The PDRole is rendered whole (so
`pdctl render` output applies as it is), but the controller takes spec.replicas out of what it
applies: its server-side apply must never own that field, which a scaler writes. It sets the field
only when it creates the PDRole and when it forwards a change of the PDDeployment's
spec.<role>.replicas (controller/pdroles.py).
"""

from __future__ import annotations

from pd_operator.api.labels import DEPLOYMENT, POD_INDEX, ROLE
from pd_operator.api.types import API_VERSION, ROLE_KIND
from pd_operator.render.labels import metadata
from pd_operator.spec.validate import Resolved


def pd_role(ctx: Resolved, role: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": ROLE_KIND,
            "metadata": metadata(ctx, ctx.names.role(role), role),
            "spec": {"deployment": ctx.deployment.name, "role": role, "replicas": ctx.role(role).replicas}}


def leader_selector(deployment: str, role: str) -> str:
    """The PDRole's status.selector: one pod per instance, its leader (ordinal 0), which serves vLLM's
    /metrics, so that an HPA's Pods metric averages over instances."""
    return f"{DEPLOYMENT}={deployment},{ROLE}={role},{POD_INDEX}=0"

"""The admission verdict on a PDDeployment: the same `validate` as pdctl and the controller. Pure.

The webhook cannot read ConfigMaps (the API server waits on it), so an `hfConfigMap` model is
admitted with a warning and the controller reports its KV check in the KVCompatible condition.
"""

from __future__ import annotations

from dataclasses import dataclass

from pd_operator.render.runnable import validate
from pd_operator.serving_image.contents import DEFAULT_TOOLS_IMAGE
from pd_operator.spec.host_paths import DEFAULT, HostPathPolicy
from pd_operator.spec.node_access import DEFAULT as NO_NODE_ACCESS
from pd_operator.spec.node_access import NodeAccess

UPDATE_NOTE = "The update is rejected; the running deployment keeps serving its previous spec."


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str
    warnings: list[str]


def verdict(body: dict, operation: str, host_path_policy: HostPathPolicy = DEFAULT,
            tools_image: str = DEFAULT_TOOLS_IMAGE, node_access: NodeAccess = NO_NODE_ACCESS) -> Verdict:
    result = validate(body, host_path_policy=host_path_policy, tools_image=tools_image,
                      node_access=node_access)
    warnings = [f"{f.path}: {f.message}" if f.path else f.message for f in result.warnings]
    errors = [f"{f.path}: {f.message}" if f.path else f.message for f in result.errors]
    if not errors:
        return Verdict(True, "", warnings)
    message = " ".join(errors)
    if operation == "UPDATE":
        message = f"{message} {UPDATE_NOTE}"
    return Verdict(False, message, warnings)

"""PDDeployment documents for tests: the examples as dicts, the node-access attack, and the validator's
Resolved for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pd_operator.render.runnable import validate
from pd_operator.spec.validate import Resolved, Validation

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GLM = "glm-5.3-flash-tp8-dp2tp4.yaml"
"""The example most tests serve: GLM-5.3-Flash, prefill TP8 -> decode DP2 x TP4."""


def example(name: str | Path = GLM, namespace: str | None = None) -> dict[str, Any]:
    """A manifest from examples/ (a file name there, or a path), moved into `namespace` when given."""
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    if namespace:
        doc["metadata"]["namespace"] = namespace
    return dict(doc)


def resolved_of(validation: Validation) -> Resolved:
    """The Resolved of a validation the test expects to be servable (fails the test otherwise)."""
    assert validation.resolved is not None, [f.line() for f in validation.findings]
    return validation.resolved


def resolve(doc: dict[str, Any]) -> Resolved:
    return resolved_of(validate(doc))


def sniffer() -> dict:
    """The attack of the issue: decode on the host network, tolerating every taint, on a
    control-plane node, creating a root-owned file the A3 preset does not mount."""
    doc = example()
    doc["spec"]["decode"] |= {
        "hostNetwork": True,
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "huawei.com/ascend-1980", "operator": "Exists", "effect": "NoSchedule"},
                        {"operator": "Exists"}],
        "hostMounts": {"generation": "A3",
                       "paths": [{"path": "/etc/hccl_rootinfo.json", "type": "FileOrCreate"}]},
    }
    return doc


SNIFFER_FIELDS = {"spec.decode.hostNetwork": "HostNetworkNotAllowed",
                  "spec.decode.tolerations[1]": "TolerationNotAllowed",
                  "spec.decode.hostMounts.paths[0].type": "HostPathCreationNotAllowed"}
"""Where the validator refuses the sniffer without the admin's options, and the finding."""

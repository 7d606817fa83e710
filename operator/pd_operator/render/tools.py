"""The tools bundle in a serving pod (serving_image/bundle.py): an emptyDir, an init container of the
operator image that fills it (`pd-bundle`), and the read-only mount through which the engine container
runs `pd-preflight` and the probe sidecar `pd-kv-probe`, both with the serving image's own python3.
So a stock vllm-ascend image runs the pods as rendered: nothing of ours needs to be in it."""

from __future__ import annotations

from pd_operator.render import security
from pd_operator.serving_image import bundle
from pd_operator.spec.validate import Resolved

VOLUME = "pd-tools"
INIT_CONTAINER = "pd-tools"
SIZE_LIMIT = "64Mi"  # the bundle is about 1 MB of Python source
PULL_POLICY = "IfNotPresent"
"""The tools image is versioned with the operator (the chart's appVersion): pulled once per node."""


def volume() -> dict:
    return {"name": VOLUME, "emptyDir": {"sizeLimit": SIZE_LIMIT}}


def mount() -> dict:
    """How the engine and probe containers see the bundle: read-only, so neither can change the checks."""
    return {"name": VOLUME, "mountPath": bundle.MOUNT, "readOnly": True}


def init_container(ctx: Resolved) -> dict:
    return {
        "name": INIT_CONTAINER,
        "image": ctx.tools_image,
        "imagePullPolicy": PULL_POLICY,
        "command": [bundle.COMMAND, bundle.MOUNT],
        "volumeMounts": [{"name": VOLUME, "mountPath": bundle.MOUNT}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": dict(security.TOOLS),
    }

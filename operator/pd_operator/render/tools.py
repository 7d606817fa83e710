"""The tools bundle in a serving pod (serving_image/bundle.py): an emptyDir, an init container of the
operator image that fills it (`pd-bundle`), and the read-only mount through which the engine container
runs `pd-preflight` and the probe sidecar `pd-kv-probe`, both with the serving image's own python3.
So a stock vllm-ascend image runs the pods as rendered: nothing of ours needs to be in it.

A second init container, `pd-image-report`, runs `pd-preflight --report` in the serving image: what
its vllm-ascend is (version, build commit, the seed change) becomes its termination message, which
the kubelet copies into the pod's status (`initContainerStatuses[].state.terminated.message`), and
the operator shows per instance (status.<role>.instances[].vllmAscend). Through the pod's status, so
the operator reads no log and the pods need no API access."""

from __future__ import annotations

from pd_operator.render import security
from pd_operator.render.command import PREFLIGHT
from pd_operator.serving_image import bundle
from pd_operator.spec.validate import Resolved

VOLUME = "pd-tools"
INIT_CONTAINER = "pd-tools"
REPORT_CONTAINER = "pd-image-report"
TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default terminationMessagePath, rendered so the report's path is visible."""
SIZE_LIMIT = "64Mi"  # the bundle is about 1 MB of Python source
PULL_POLICY = "IfNotPresent"
"""The tools image is versioned with the operator (the chart's appVersion): pulled once per node,
unless the admin forces every pull (`--always-pull-images`)."""


def pull_policy(ctx: Resolved) -> str:
    return ctx.node_access.pull_policy(PULL_POLICY)


def volume() -> dict:
    return {"name": VOLUME, "emptyDir": {"sizeLimit": SIZE_LIMIT}}


def mount() -> dict:
    """How the engine and probe containers see the bundle: read-only, so neither can change the checks."""
    return {"name": VOLUME, "mountPath": bundle.MOUNT, "readOnly": True}


def init_container(ctx: Resolved) -> dict:
    return {
        "name": INIT_CONTAINER,
        "image": ctx.tools_image,
        "imagePullPolicy": pull_policy(ctx),
        "command": [bundle.COMMAND, bundle.MOUNT],
        "volumeMounts": [{"name": VOLUME, "mountPath": bundle.MOUNT}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": dict(security.TOOLS),
    }


def report_container(ctx: Resolved) -> dict:
    """Runs after `init_container` (it needs the bundle), in the serving image."""
    image = ctx.deployment.spec.image
    return {
        "name": REPORT_CONTAINER,
        "image": image.name,
        "imagePullPolicy": ctx.serving_pull_policy(),
        "command": [*bundle.command(PREFLIGHT), "--report", TERMINATION_LOG],
        "volumeMounts": [mount()],
        "terminationMessagePath": TERMINATION_LOG,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": dict(security.SIDECAR),
    }

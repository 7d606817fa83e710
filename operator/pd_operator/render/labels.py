"""Labels of every rendered object, and the kv-layout hash that pairs compatible prefill and decode.

`app.kubernetes.io/*` are the recommended labels; `pd.serving.dev/*` are what selectors use. The
kv-layout hash covers everything that must match between a prefill and a decode engine for a KV
pull to be correct, so the controller and the proxy can refuse to pair pods of different layouts
(for example old prefill with new decode in the middle of a rollout).
"""

from __future__ import annotations

import hashlib
import json

from pd_operator import images
from pd_operator.render.context import Context

NAME = "pd-serving"
MANAGER = "pd-operator"
GROUP = "pd.serving.dev"
DEPLOYMENT = f"{GROUP}/deployment"
ROLE = f"{GROUP}/role"
INSTANCE = f"{GROUP}/instance"
KV_LAYOUT = f"{GROUP}/kv-layout"
COMPONENT = "app.kubernetes.io/component"
# The pod's ordinal in its StatefulSet, set by the StatefulSet controller (GA in 1.32;
# k8s.io/api: apps/v1/types.go PodIndexLabel @ v0.36.3): 0 is an instance's leader.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
# On a PDRole: the spec.<role>.replicas of the PDDeployment the operator last forwarded to it.
FORWARDED_REPLICAS = f"{GROUP}/forwarded-replicas"
# The pod annotation naming a pod's Volcano PodGroup (volcano.sh/apis: pkg/apis/scheduling/v1beta1/
# labels.go KubeGroupNameAnnotationKey @ v1.13.0).
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
HASH_CHARS = 12


def kv_layout_hash(ctx: Context) -> str:
    spec = ctx.dep.spec
    caps = images.of_image(spec.image)
    assert caps is not None, "validate() refuses an image without known capabilities (ImageUnknown)"
    identity = {
        "model": ctx.model.name, "path": spec.model.name, "dtype": ctx.model.dtype,
        "kvCacheDtype": ctx.layouts["prefill"].side.cache_dtype,  # resolved: `auto` is the model dtype
        "blockSize": {role: ctx.engine_block_size(role) for role in ("prefill", "decode")},
        "connector": spec.kv_transfer.connector,
        "image": spec.image.name,
        # The runner changes how blocks are handed to the connector (PR #16755), and spec.image can
        # change it (seedChange) without a new image name.
        "modelRunnerV2": images.model_runner_env(caps, ctx.model),
    }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def selector(ctx: Context, component: str | None, index: int | None = None) -> dict[str, str]:
    """Stable labels a selector may use: they never change for the life of the object."""
    out = {DEPLOYMENT: ctx.dep.name}
    if component is not None:
        out[ROLE] = component
    if index is not None:
        out[INSTANCE] = str(index)
    return out


def labels(ctx: Context, component: str | None, index: int | None = None) -> dict[str, str]:
    """Recommended and selector labels; `component` None for objects of the whole deployment."""
    out = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": ctx.dep.name}
    if component is not None:
        out[COMPONENT] = component
    out |= {"app.kubernetes.io/managed-by": MANAGER, "app.kubernetes.io/part-of": MANAGER,
            **selector(ctx, component, index)}
    if component in ("prefill", "decode"):
        out[KV_LAYOUT] = kv_layout_hash(ctx)
    return out


def metadata(ctx: Context, name: str, component: str | None, index: int | None = None) -> dict:
    return {"name": name, "namespace": ctx.dep.namespace, "labels": labels(ctx, component, index)}

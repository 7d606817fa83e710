"""Labels of every rendered object (their keys: api/labels.py). Serving pods also carry the kv-layout
hash (spec/layout.py) that pairs compatible prefill and decode."""

from __future__ import annotations

from pd_operator.api.labels import (
    APP_INSTANCE,
    APP_NAME,
    COMPONENT,
    DEPLOYMENT,
    INSTANCE,
    KV_LAYOUT,
    MANAGED_BY,
    MANAGER,
    NAME,
    PART_OF,
    ROLE,
)
from pd_operator.spec.validate import Resolved


def selector(ctx: Resolved, component: str | None, index: int | None = None) -> dict[str, str]:
    """Stable labels a selector may use: they never change for the life of the object."""
    out = {DEPLOYMENT: ctx.deployment.name}
    if component is not None:
        out[ROLE] = component
    if index is not None:
        out[INSTANCE] = str(index)
    return out


def labels(ctx: Resolved, component: str | None, index: int | None = None) -> dict[str, str]:
    """Recommended and selector labels; `component` None for objects of the whole deployment."""
    out = {APP_NAME: NAME, APP_INSTANCE: ctx.deployment.name}
    if component is not None:
        out[COMPONENT] = component
    out |= {MANAGED_BY: MANAGER, PART_OF: MANAGER,
            **selector(ctx, component, index)}
    if component in ("prefill", "decode"):
        out[KV_LAYOUT] = ctx.layout_hash
    return out


def metadata(ctx: Resolved, name: str, component: str | None, index: int | None = None) -> dict:
    return {"name": name, "namespace": ctx.deployment.namespace, "labels": labels(ctx, component, index)}

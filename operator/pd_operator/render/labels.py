"""Labels of every rendered object (their keys: api/labels.py). Serving pods also carry the kv-layout
hash (spec/layout.py) that pairs compatible prefill and decode."""

from __future__ import annotations

from pd_operator.api.labels import COMPONENT, DEPLOYMENT, INSTANCE, KV_LAYOUT, MANAGED_BY, MANAGER, NAME, ROLE
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
    out = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": ctx.deployment.name}
    if component is not None:
        out[COMPONENT] = component
    out |= {MANAGED_BY: MANAGER, "app.kubernetes.io/part-of": MANAGER,
            **selector(ctx, component, index)}
    if component in ("prefill", "decode"):
        out[KV_LAYOUT] = ctx.layout_hash
    return out


def metadata(ctx: Resolved, name: str, component: str | None, index: int | None = None) -> dict:
    return {"name": name, "namespace": ctx.deployment.namespace, "labels": labels(ctx, component, index)}

"""Container resources as rendered for every container the operator runs (serving pods, the proxy)."""

from __future__ import annotations

from pd_operator.api.types import Resources


def resources(user: Resources, npu_name: str | None = None, npus: int = 0) -> dict:
    """The user's resources with the NPU count of the shape set on both requests and limits
    (extended resources must have requests equal to limits)."""
    requests, limits = dict(user.requests), dict(user.limits)
    if npu_name:
        requests[npu_name] = limits[npu_name] = npus
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}

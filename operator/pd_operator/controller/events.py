"""The events the reconcile posts on a PDDeployment, and their wording. Pure: the reconcile posts
them. Reasons come from api/conditions.py (the docs table lists them).

Events are for news: a significant condition change (`transitions`), an instance a scale-down
removed that drained or timed out, an instance a rollout replaced. A level-based reconcile that
repeats posts nothing new.
"""

from __future__ import annotations

from collections.abc import Iterable

from pd_operator.api.conditions import (
    DEGRADED,
    DRAIN_TIMED_OUT,
    DRAINED,
    INSTANCE_REPLACED,
    INSTANCES_NOT_READY,
    KV_COMPATIBLE,
    KV_LINK_NOT_READY,
    NO_UPSTREAMS,
    PROGRESS_DEADLINE_EXCEEDED,
    PROXY_NOT_READY,
    READY,
    ROLLOUT_BLOCKED,
)
from pd_operator.controller.drain import Drain

Event = tuple[str, str, str]
"""(type Normal|Warning, reason, message)."""

SIGNIFICANT = {KV_COMPATIBLE, READY, DEGRADED}
STOPPED = {PROGRESS_DEADLINE_EXCEEDED, ROLLOUT_BLOCKED}
"""Progressing reasons worth a Warning event: a rollout stopped and needs the user."""
STARTING = {INSTANCES_NOT_READY, PROXY_NOT_READY, NO_UPSTREAMS, KV_LINK_NOT_READY}
"""Ready=False reasons that only mean "not up yet": no event when an object starts with them."""


def transitions(previous: list[dict], current: list[dict]) -> list[Event]:
    """Events for significant condition changes."""
    before = {c["type"]: c for c in previous}
    out = []
    for cond in current:
        prior = before.get(cond["type"])
        if (cond["type"] not in SIGNIFICANT and cond["reason"] not in STOPPED) or (
                prior and (prior["status"], prior["reason"]) == (cond["status"], cond["reason"])):
            continue
        if prior is None and (cond["type"], cond["status"]) == (DEGRADED, "False"):
            continue  # "not degraded" at creation is not news
        starting = (cond["type"], cond["status"]) == (READY, "False") and cond["reason"] in STARTING
        if prior is None and starting:
            continue
        bad = (cond["type"] == DEGRADED) == (cond["status"] == "True") or cond["reason"] in STOPPED
        out.append(("Warning" if bad else "Normal", cond["reason"], cond["message"]))
    return out


def replaced(drained: Drain, old: Iterable[str], new: str, bound_seconds: int) -> Event:
    """A rollout deleted the pods of `drained` (revisions `old`) to recreate them on revision `new`."""
    why = f"its drain bound ({bound_seconds} s) passed" if drained.timed_out else "it drained"
    return ("Normal", INSTANCE_REPLACED,
            f"Replacing the pods of {drained.role} instance {drained.name} (revision {', '.join(old)} -> "
            f"{new}): it left the proxy and {why}.")


def deleted(drained: Drain, bound_seconds: int) -> Event:
    """A scale-down deleted `drained`, drained or past its bound."""
    if drained.timed_out:
        return ("Warning", DRAIN_TIMED_OUT,
                f"Deleted {drained.role} instance {drained.name}: its drain bound ({bound_seconds} s) passed "
                "while it may still have held requests.")
    return ("Normal", DRAINED,
            f"Deleted {drained.role} instance {drained.name}: it left the proxy and no request needs it "
            "any more.")

"""Group restarts of multi-pod instances. Pure: the caller passes the clock.

The ranks of one vLLM engine (a StatefulSet with more than one pod) cannot recover alone when one
of them dies: the survivors wait on collectives that never complete. So when any pod of such an
instance failed or restarted, every pod of the instance is deleted and the StatefulSet recreates
the group. Pods made by that restart start with restartCount 0, so "any restartCount > 0" is the
whole trigger and needs no remembered baseline. Restarts are rate limited per instance; their
times live in an annotation on the StatefulSet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pd_operator.controller.pods import has_failed, is_terminating

HISTORY = "pd.serving.dev/group-restarts"
WINDOW = timedelta(minutes=10)
LIMIT = 3
"""At most LIMIT group restarts of one instance per WINDOW; after that it stays Degraded."""


@dataclass(frozen=True)
class Decision:
    instance: str
    action: str
    """`restart` (delete `pods`), `limited` (should restart but the budget is spent) or `none`."""
    failed: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()
    history: tuple[str, ...] = ()
    """Restart times within the window, including a new one when action is restart."""


def _parse(times: str) -> list[datetime]:
    out = []
    for item in filter(None, (t.strip() for t in times.split(","))):
        try:
            out.append(datetime.fromisoformat(item))
        except ValueError:
            continue  # a hand-edited annotation must not stop restarts
    return out


def _created(pod: dict) -> datetime:
    stamp = pod["metadata"].get("creationTimestamp")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else datetime.max.replace(tzinfo=UTC)


def recent_restarts(stateful_set: dict, now: datetime) -> list[datetime]:
    raw = (stateful_set["metadata"].get("annotations") or {}).get(HISTORY, "")
    return [t for t in _parse(raw) if now - t < WINDOW]


def decide(stateful_set: dict, pods: list[dict], now: datetime) -> Decision:
    """What to do about one instance, given its StatefulSet and its pods."""
    name = stateful_set["metadata"]["name"]
    if (stateful_set.get("spec") or {}).get("replicas", 1) <= 1:
        return Decision(name, "none")  # a single pod restarts fine on its own
    live = [p for p in pods if not is_terminating(p)]
    failed = tuple(sorted(p["metadata"]["name"] for p in live if has_failed(p)))
    if not failed:
        return Decision(name, "none")
    history = recent_restarts(stateful_set, now)
    if history and any(_created(p) < max(history) for p in live):
        return Decision(name, "none")  # a view from before the last restart (a lagging cache)
    stamps = tuple(t.isoformat() for t in history)
    if len(history) >= LIMIT:
        return Decision(name, "limited", failed, (), stamps)
    return Decision(name, "restart", failed, tuple(sorted(p["metadata"]["name"] for p in live)),
                    (*stamps, now.isoformat()))

"""Group restarts of multi-pod instances. Pure: the caller passes the clock.

The ranks of one vLLM engine (a StatefulSet with more than one pod) cannot recover alone when one
of them dies: the survivors wait on collectives that never complete. So when any pod of such an
instance failed or restarted, every pod of the instance is deleted and the StatefulSet recreates
the group. Pods made by that restart start with restartCount 0, so "any restartCount > 0" is the
whole trigger and needs no remembered baseline. A pod the kubelet marks Failed (evicted, say) is
deleted and replaced by the StatefulSet controller at once; the runner passes its failed state on
(runner.py), so its peers are restarted even when the index no longer shows it. Restarts are rate
limited per instance; their times, and the uids of the pods the last one deleted (a lagging cache
may still show them), live in annotations on the StatefulSet.

A template change replaces an instance whole too. The StatefulSet controller rolls pods one at a
time (k8s.io/kubernetes: pkg/controller/statefulset/stateful_set_control.go @ v1.36.3), but ranks of
two revisions cannot form one engine, and under kube-scheduler's gang a new pod waits for the whole
of its new PodGroup (render/scheduling.py), which the rolling update never creates: the roll would
stop at its first pod. So once any pod of an instance runs the StatefulSet's update revision, the
pods still on an older one are deleted together (`replace`); the controller recreates them at the
update revision (newVersionedStatefulSetPod in stateful_set_utils.go @ v1.36.3, with the defaulted
partition 0). Not rate limited: it follows a spec change, not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from pd_operator.api.labels import CONTROLLER_REVISION_HASH, GROUP_RESTART_DELETED, GROUP_RESTARTS
from pd_operator.controller.pods import has_failed, is_terminating

WINDOW = timedelta(minutes=10)
LIMIT = 3
"""At most LIMIT group restarts of one instance per WINDOW; after that it stays Degraded."""


@dataclass(frozen=True)
class Decision:
    instance: str
    action: str
    """`restart` (delete `pods`), `limited` (should restart but the budget is spent), `replace`
    (delete `pods`, the ranks left on an old revision) or `none`."""
    failed: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()
    history: tuple[str, ...] = ()
    deleted_uids: tuple[str, ...] = ()
    """The uids of `pods` (restart) to record, so a stale view of them is never restarted again."""

    def annotations(self) -> dict[str, str]:
        return {GROUP_RESTARTS: ",".join(self.history), GROUP_RESTART_DELETED: ",".join(self.deleted_uids)}
    """Restart times within the window, including a new one when action is restart."""


def _parse(times: str) -> list[datetime]:
    out = []
    for item in filter(None, (t.strip() for t in times.split(","))):
        try:
            out.append(datetime.fromisoformat(item))
        except ValueError:
            continue  # a hand-edited annotation must not stop restarts
    return out


def recent_restarts(stateful_set: dict, now: datetime) -> list[datetime]:
    raw = (stateful_set["metadata"].get("annotations") or {}).get(GROUP_RESTARTS, "")
    return [t for t in _parse(raw) if now - t < WINDOW]


def decide(stateful_set: dict, pods: list[dict], now: datetime) -> Decision:
    """What to do about one instance, given its StatefulSet and its pods."""
    name = stateful_set["metadata"]["name"]
    if (stateful_set.get("spec") or {}).get("replicas", 1) <= 1:
        return Decision(name, "none")  # a single pod restarts fine on its own
    annotations = stateful_set["metadata"].get("annotations") or {}
    deleted = set(annotations.get(GROUP_RESTART_DELETED, "").split(","))
    live = [p for p in pods if not is_terminating(p) and p["metadata"].get("uid") not in deleted]
    failed = tuple(sorted(p["metadata"]["name"] for p in live if has_failed(p)))
    if not failed:
        return _replace(stateful_set, live)
    history = recent_restarts(stateful_set, now)
    stamps = tuple(t.isoformat() for t in history)
    if len(history) >= LIMIT:
        return Decision(name, "limited", failed, (), stamps)
    live.sort(key=lambda p: p["metadata"]["name"])
    return Decision(name, "restart", failed, tuple(p["metadata"]["name"] for p in live),
                    (*stamps, now.isoformat()), tuple(p["metadata"]["uid"] for p in live))


def _replace(stateful_set: dict, live: list[dict]) -> Decision:
    """`replace` the ranks on an older revision once one runs the update revision, else `none`."""
    name = stateful_set["metadata"]["name"]
    status = stateful_set.get("status") or {}
    update = status.get("updateRevision")
    revisions = {(p["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH) for p in live}
    if not update or update not in revisions or len(revisions) < 2:
        return Decision(name, "none")
    if not revisions <= {update, status.get("currentRevision")}:
        return Decision(name, "none")  # a pod newer than this view of the StatefulSet: it lags
    stale = sorted((p for p in live
                    if (p["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH) != update),
                   key=lambda p: p["metadata"]["name"])
    return Decision(name, "replace", pods=tuple(p["metadata"]["name"] for p in stale),
                    deleted_uids=tuple(p["metadata"]["uid"] for p in stale))

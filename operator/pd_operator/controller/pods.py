"""Facts about observed pods and instances, shared by the status, rollout and restart decisions."""

from __future__ import annotations

from collections import defaultdict

from pd_operator.api.labels import INSTANCE, KV_LAYOUT, ROLE


def is_ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def unschedulable(pod: dict) -> str | None:
    """The scheduler's message when it could not place the pod (its PodScheduled condition is
    False: no node with enough NPUs, a PersistentVolumeClaim that does not exist, ...), else None."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "not scheduled")
    return None


def has_failed(pod: dict) -> bool:
    """Phase Failed, or a container restarted since the pod was created (restartCount > 0)."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return True
    return any(c.get("restartCount", 0) > 0 for c in status.get("containerStatuses") or [])


def is_terminating(obj: dict) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def label(obj: dict, name: str) -> str | None:
    return (obj.get("metadata", {}).get("labels") or {}).get(name)


def by_instance(pods: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """Live pods of prefill/decode instances, keyed by (role, instance index)."""
    out: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for pod in pods:
        role, index = label(pod, ROLE), label(pod, INSTANCE)
        if role in ("prefill", "decode") and index is not None and index.isdigit() \
                and not is_terminating(pod):
            out[(role, int(index))].append(pod)
    return dict(out)


def instance_ready(pods: list[dict], expected_pods: int) -> bool:
    """All ranks of one engine exist, are Ready, and run one KV layout (ranks of two layouts, a
    replacement under way, form no engine)."""
    return (len(pods) == expected_pods and all(is_ready(p) for p in pods)
            and len({label(p, KV_LAYOUT) for p in pods}) == 1)

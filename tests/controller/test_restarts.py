"""Group-restart decisions for multi-pod instances (pure, explicit clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pd_operator.api.labels import CONTROLLER_REVISION_HASH, GROUP_RESTARTS
from pd_operator.controller.restarts import LIMIT, WINDOW, decide
from support.controller_fakes import pod

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LABELS = {"pd.serving.dev/role": "decode", "pd.serving.dev/instance": "0"}


def _sts(replicas: int, history: list[datetime] | str = ()) -> dict:
    text = history if isinstance(history, str) else ",".join(t.isoformat() for t in history)
    return {"metadata": {"name": "glm-decode-0", "annotations": {GROUP_RESTARTS: text} if text else {}},
            "spec": {"replicas": replicas}}


def _group(n: int, **broken: dict) -> list[dict]:
    return [pod(f"glm-decode-0-{i}", LABELS, **broken.get(f"p{i}", {})) for i in range(n)]


def test_healthy_group_needs_nothing():
    assert decide(_sts(2), _group(2), NOW).action == "none"


def test_single_pod_instances_are_left_to_the_kubelet():
    assert decide(_sts(1), _group(1, p0={"restarts": 3}), NOW).action == "none"


@pytest.mark.parametrize("broken", [{"restarts": 1}, {"phase": "Failed", "ready": False}])
def test_one_failed_rank_restarts_the_whole_group(broken):
    d = decide(_sts(2), _group(2, p1=broken), NOW)
    assert d.action == "restart" and d.failed == ("glm-decode-0-1",)
    assert d.pods == ("glm-decode-0-0", "glm-decode-0-1")
    assert d.history == (NOW.isoformat(),)


def test_terminating_pods_are_not_counted_twice():
    group = _group(2, p1={"restarts": 1})
    group[1]["metadata"]["deletionTimestamp"] = NOW.isoformat()
    assert decide(_sts(2), group, NOW).action == "none"


def test_pods_the_last_restart_deleted_are_a_stale_view():
    group = _group(2, p1={"restarts": 1})
    first = decide(_sts(2), group, NOW)
    assert first.deleted_uids == ("uid-glm-decode-0-0", "uid-glm-decode-0-1")
    sts = _sts(2)
    sts["metadata"]["annotations"] = first.annotations()
    assert decide(sts, group, NOW).action == "none"  # the cache still shows the deleted pods
    fresh = [pod(f"glm-decode-0-{i}", LABELS, restarts=i) for i in range(2)]
    for p in fresh:
        p["metadata"]["uid"] += "-new"
    assert decide(sts, fresh, NOW).action == "restart"  # the new group failed again


def test_restarts_are_rate_limited_within_the_window():
    recent = [NOW - timedelta(minutes=m) for m in range(1, LIMIT + 1)]
    d = decide(_sts(2, recent), _group(2, p0={"restarts": 1}), NOW)
    assert d.action == "limited" and d.pods == ()


def test_old_restarts_fall_out_of_the_window():
    old = [NOW - WINDOW - timedelta(seconds=1)] * LIMIT
    d = decide(_sts(2, old), _group(2, p0={"restarts": 1}), NOW)
    assert d.action == "restart" and d.history == (NOW.isoformat(),)


def test_a_garbled_history_does_not_block_restarts():
    d = decide(_sts(2, "yesterday,,not-a-time"), _group(2, p0={"restarts": 1}), NOW)
    assert d.action == "restart"


def _revised(sts: dict, update: str, revisions: list[str]) -> tuple[dict, list[dict]]:
    """`sts` with status.updateRevision `update`, and its pods on `revisions` (by ordinal)."""
    group = _group(len(revisions))
    for p, revision in zip(group, revisions, strict=True):
        p["metadata"]["labels"] = {**p["metadata"]["labels"], CONTROLLER_REVISION_HASH: revision}
    return {**sts, "status": {"currentRevision": "old", "updateRevision": update}}, group


@pytest.mark.parametrize(("revisions", "replaced"), [
    (["old", "old", "new"], ("glm-decode-0-0", "glm-decode-0-1")),  # the roll began: the rest go together
    (["old", "old", "old"], ()),  # not begun: the StatefulSet controller takes the first step
    (["new", "new", "new"], ()),  # done
])
def test_a_begun_roll_replaces_the_rest_of_the_instance(revisions, replaced):
    sts, group = _revised(_sts(3), "new", revisions)
    decision = decide(sts, group, NOW)
    assert (decision.action, decision.pods) == (("replace", replaced) if replaced else ("none", ()))
    assert decision.history == ()  # no restart budget spent


def test_a_failed_rank_restarts_rather_than_replaces():
    sts, group = _revised(_sts(2), "new", ["old", "new"])
    group[1]["status"]["containerStatuses"][0]["restartCount"] = 1
    assert decide(sts, group, NOW).action == "restart"


def test_a_stale_view_of_the_statefulset_replaces_nothing():
    """A pod of a revision the StatefulSet as seen does not know yet: the view lags the pods, and
    its update revision is the old one; acting on it would delete the new pod."""
    sts, group = _revised(_sts(3), "old", ["old", "old", "new"])
    assert decide(sts, group, NOW).action == "none"

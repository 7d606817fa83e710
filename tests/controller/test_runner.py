"""The runner's memory of its own writes, laid over a kopf index that has not caught up yet."""

from __future__ import annotations

import pytest

from pd_operator.controller import runner as runner_mod
from pd_operator.controller.metrics import Metrics
from pd_operator.controller.reconcile import Outcome
from pd_operator.controller.runner import Runner, index_id

KEY = ("default", "glm")


def _obj(kind: str, name: str, rv: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "resourceVersion": rv}}


@pytest.fixture
def runner() -> Runner:
    r = Runner(client=None, metrics=Metrics())  # type: ignore[arg-type]
    _index(r)
    return r


def _index(r: Runner, *objs: dict) -> None:
    r.use_indexes(["services"], {index_id("services"): {KEY: list(objs)}})


def _names(r: Runner) -> list[str]:
    return [c["metadata"]["name"] for c in r._snapshot(KEY)[0]]


def test_own_applies_fill_in_until_their_watch_event_comes(runner):
    runner._remember(KEY, Outcome(applied=[_obj("Service", "a", "5")]), since=0.0)
    assert _names(runner) == ["a"]
    runner.child_event(KEY, _obj("Service", "a"))
    assert _names(runner) == []  # e.g. deleted by hand right after: the index is the truth again
    _index(runner, _obj("Service", "a", "6"))
    assert [c["metadata"]["resourceVersion"] for c in runner._snapshot(KEY)[0]] == ["6"]


def test_own_prunes_hide_the_index_entry_until_their_event_comes(runner):
    _index(runner, _obj("Service", "old"))
    runner._remember(KEY, Outcome(pruned=[_obj("Service", "old")]), since=0.0)
    assert _names(runner) == []
    runner.child_event(KEY, _obj("Service", "old"))
    assert _names(runner) == ["old"]  # the index still had it at that event: trust the index


def test_an_event_during_the_reconcile_means_nothing_to_remember(runner):
    since = runner_mod.time.monotonic()
    runner.child_event(KEY, _obj("Service", "a"))
    runner._remember(KEY, Outcome(applied=[_obj("Service", "a")]), since=since)
    assert _names(runner) == []


def test_memory_expires(runner, monkeypatch):
    runner._remember(KEY, Outcome(applied=[_obj("Service", "a")]), since=0.0)
    now = runner_mod.time.monotonic()
    monkeypatch.setattr(runner_mod.time, "monotonic", lambda: now + runner_mod.WRITE_MEMORY_S + 1)
    assert _names(runner) == []


def _pod(uid: str, *, phase: str = "Running", deleting: bool = False) -> dict:
    meta = {"name": "glm-decode-0-1", "uid": uid, **({"deletionTimestamp": "2026-01-01T00:00:00Z"}
                                                       if deleting else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": {"phase": phase}}


def _pods_index(r: Runner, *pods: dict) -> None:
    r.use_indexes(["services", "pods"], {index_id("services"): {KEY: []},
                                         index_id("pods"): {KEY: list(pods)}})


def test_a_pod_seen_failed_stays_visible_after_its_statefulset_replaced_it(runner):
    failed = _pod("old", phase="Failed")
    runner.child_event(KEY, failed)
    # The StatefulSet controller deleted it and made a new pod of the same name before the reconcile.
    _pods_index(runner, _pod("old", phase="Failed", deleting=True), _pod("new"))
    pods = runner._snapshot(KEY)[1]
    assert [(p["metadata"]["uid"], p["status"]["phase"], "deletionTimestamp" in p["metadata"])
            for p in pods] == [("old", "Failed", True), ("new", "Running", False), ("old", "Failed", False)]


def test_a_failed_pod_still_in_the_index_is_not_doubled_and_healthy_ones_are_not_remembered(runner):
    runner.child_event(KEY, _pod("a", phase="Failed"))
    runner.child_event(KEY, _pod("b"))
    _pods_index(runner, _pod("a", phase="Failed"), _pod("b"))
    assert [p["metadata"]["uid"] for p in runner._snapshot(KEY)[1]] == ["a", "b"]


def test_pods_a_reconcile_deleted_are_left_out_until_the_index_shows_them_going(runner):
    """A lagging index right after a rollout deleted an instance's pods still lists them Running:
    the next reconcile must not count them as serving (it would let another instance leave). They
    stay out until the index shows them terminating or gone, then the index is the truth again."""
    _pods_index(runner, _pod("deleted"), _pod("kept"))
    runner._remember(KEY, Outcome(deleted_pods=["deleted"]), since=0.0)
    assert [p["metadata"]["uid"] for p in runner._snapshot(KEY)[1]] == ["kept"]
    _pods_index(runner, _pod("deleted", deleting=True), _pod("kept"))
    assert [p["metadata"]["uid"] for p in runner._snapshot(KEY)[1]] == ["deleted", "kept"]
    assert not runner._deleted[KEY]  # forgotten: a pod of that uid never comes back
    _pods_index(runner, _pod("kept"))
    assert [p["metadata"]["uid"] for p in runner._snapshot(KEY)[1]] == ["kept"]

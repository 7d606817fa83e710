"""The runner: its memory of its own writes, laid over a kopf index that has not caught up yet; which
events trigger a reconcile (a new spec, a child's change, not the echo of its own write); and how
events during a reconcile fold into one more."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pd_operator.controller import runner as runner_mod
from pd_operator.controller.metrics import Metrics
from pd_operator.controller.reconcile import Outcome
from pd_operator.controller.runner import Runner, index_id

KEY = ("default", "glm")


def _obj(kind: str, name: str, rv: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "resourceVersion": rv}}


class Pokes(list):
    """What the runner scheduled, instead of scheduling it: (key, trigger, delay)."""

    def __call__(self, namespace: str, name: str, trigger: str = "child", delay: float | None = None) -> None:
        self.append(((namespace, name), trigger, delay))


@pytest.fixture
def runner() -> Runner:
    r = Runner(client=None, metrics=Metrics())  # type: ignore[arg-type]
    r.poke = Pokes()  # type: ignore[method-assign]
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


def test_the_echo_of_an_own_write_triggers_nothing_a_later_change_does(runner):
    runner._remember(KEY, Outcome(applied=[_obj("Service", "a", "5")]), since=0.0)
    runner.child_event(KEY, _obj("Service", "a", "5"))
    assert runner.poke == []
    runner.child_event(KEY, _obj("Service", "a", "6"))  # e.g. a controller's status write after ours
    assert runner.poke == [(KEY, "child", None)]


def test_child_events_during_a_reconcile_count_unless_they_echo_its_writes(runner):
    runner._during[KEY] = []
    runner.child_event(KEY, _obj("Service", "a", "5"))
    runner.child_event(KEY, _obj("StatefulSet", "b", "7"))
    assert runner.poke == []  # decided once the reconcile has returned its writes
    runner._after(KEY, Outcome(applied=[_obj("Service", "a", "5"), _obj("StatefulSet", "b", "7")]))
    assert runner.poke == []
    runner._during[KEY] = []
    runner.child_event(KEY, _obj("Service", "a", "8"))
    runner._after(KEY, Outcome(applied=[_obj("Service", "a", "5")]))
    assert runner.poke == [(KEY, "child", None)]
    runner._during[KEY] = []
    runner.child_event(KEY, _obj("Service", "a", "9"))
    runner._after(KEY, None)  # the reconcile failed: every event counts
    assert len(runner.poke) == 2


def test_every_pod_event_triggers_a_reconcile(runner):
    runner.child_event(KEY, _pod("a"))
    assert runner.poke == [(KEY, "child", None)]


def test_a_pddeployment_is_reconciled_when_its_spec_is_new_not_on_its_status_writes(runner):
    runner.spec_event(*KEY, "ADDED", 1)
    runner.spec_event(*KEY, "MODIFIED", 1)  # a status write: same generation
    runner.spec_event(*KEY, "MODIFIED", 2)
    other = ("default", "other")
    runner.spec_event(*other, None, 4)  # kopf's listing at start
    runner.spec_event(*other, None, 4)  # listed again (a watch restart): nothing new
    assert runner.poke == [(KEY, "create", 0.0), (KEY, "update", 0.0), (other, "resume", 0.0)]
    runner.forget(*KEY)
    runner.spec_event(*KEY, "ADDED", 1)  # deleted and created again under the same name
    assert runner.poke[-1] == (KEY, "create", 0.0)


def test_events_during_a_reconcile_fold_into_one_more(monkeypatch):
    """Ten pod events while a reconcile runs start one reconcile after it, not ten."""
    started, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def reconcile(client: Any, proxies: Any, body: dict, *args: Any, **kwargs: Any) -> Outcome:
        runs.append(body["metadata"]["name"])
        started.set()
        assert release.wait(60), "the test never released the reconcile"
        return Outcome()

    class Client:
        def get_pddeployment(self, namespace: str, name: str) -> dict:
            return {"metadata": {"name": name, "namespace": namespace}}

    monkeypatch.setattr(runner_mod, "reconcile", reconcile)

    async def scenario() -> int:
        r = Runner(Client(), Metrics(), debounce_s=0.0)  # type: ignore[arg-type]
        _index(r)
        r.spec_event(*KEY, "ADDED", 1)
        assert await asyncio.to_thread(started.wait, 60)
        started.clear()
        for uid in range(10):
            r.child_event(KEY, _pod(str(uid)))
            for _ in range(10):  # let a poke's task run as far as it goes: up to the object's lock
                await asyncio.sleep(0)
        release.set()
        assert await asyncio.to_thread(started.wait, 60)  # the one follow-up
        while r._tasks:
            await asyncio.gather(*list(r._tasks))
        await r.close()
        return len(runs)

    assert asyncio.run(scenario()) == 2


def test_tree_copy_is_deep_and_refuses_what_is_not_json():
    obj = {"metadata": {"labels": {"a": "b"}}, "spec": {"n": [1, 2.5, True, None, {"x": "y"}]}}
    copied = runner_mod.tree_copy(obj)
    assert copied == obj
    copied["spec"]["n"][4]["x"] = "z"
    copied["metadata"]["labels"]["a"] = "c"
    assert obj == {"metadata": {"labels": {"a": "b"}}, "spec": {"n": [1, 2.5, True, None, {"x": "y"}]}}
    with pytest.raises(ValueError):
        runner_mod.tree_copy({"a": object()})


def test_a_new_spec_waiting_for_a_reconcile_goes_before_waiting_follow_ups(runner, monkeypatch):
    """With every reconcile slot taken, waiting follow-ups of child events keep their order, a new
    spec (a watch event with a new generation) goes before them, and a waiter cancelled meanwhile
    takes no slot with it."""
    monkeypatch.setattr(runner_mod, "RECONCILE_WORKERS", 1)
    order: list[tuple[str, str]] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def hold() -> None:
            async with runner._slot(("ns", "busy")):
                await release.wait()

        async def reconcile(key: tuple[str, str]) -> None:
            async with runner._slot(key):
                order.append(key)

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(reconcile(("ns", name))) for name in ("child-1", "child-2", "new")]
        cancelled = asyncio.create_task(reconcile(("ns", "gone")))
        await asyncio.sleep(0)
        assert list(runner._waiting) == [("ns", "child-1"), ("ns", "child-2"), ("ns", "new"), ("ns", "gone")]
        runner.spec_event("ns", "new", "MODIFIED", 2)
        cancelled.cancel()
        release.set()
        await asyncio.gather(holder, *waiting)
        assert runner._running == 0 and not runner._waiting

    asyncio.run(scenario())
    assert order == [("ns", "new"), ("ns", "child-1"), ("ns", "child-2")]

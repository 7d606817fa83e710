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

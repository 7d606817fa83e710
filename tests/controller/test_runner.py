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
    r.use_indexes(["services"], {index_id("services"): {}})
    return r


def _index(r: Runner, *objs: dict) -> None:
    r.use_indexes(["services"], {index_id("services"): {KEY: list(objs)}})


def test_own_applies_fill_in_until_the_index_shows_them(runner):
    runner._remember(KEY, Outcome(applied=[_obj("Service", "a", "5")]))
    children, _ = runner._snapshot(KEY)
    assert [c["metadata"]["name"] for c in children] == ["a"]
    _index(runner, _obj("Service", "a", "6"))
    children, _ = runner._snapshot(KEY)
    assert [c["metadata"]["resourceVersion"] for c in children] == ["6"]
    _index(runner)  # deleted by someone after the index saw it: the memory must not hide that
    assert runner._snapshot(KEY)[0] == []


def test_own_prunes_hide_the_index_entry_until_it_goes(runner):
    _index(runner, _obj("Service", "old"))
    runner._remember(KEY, Outcome(pruned=[_obj("Service", "old")]))
    assert runner._snapshot(KEY)[0] == []
    _index(runner)
    assert runner._snapshot(KEY)[0] == []
    assert runner._written[KEY] == {}


def test_memory_expires(runner, monkeypatch):
    runner._remember(KEY, Outcome(applied=[_obj("Service", "a")]))
    now = runner_mod.time.monotonic()
    monkeypatch.setattr(runner_mod.time, "monotonic", lambda: now + runner_mod.WRITE_MEMORY_S + 1)
    assert runner._snapshot(KEY)[0] == []

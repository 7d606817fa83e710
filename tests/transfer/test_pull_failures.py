"""A pull that cannot be done right is reported with the pair and the run, never as success."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from pd_operator.kv.transfer_plan import RunSet, TransferPlan
from pd_operator.transfer.engine_requests import arena_bytes, requests
from pd_operator.transfer.executor import Peer
from support.ranks import Pairing, RankWorker, start_workers
from support.transfer_pairings import few_layers, pair

pytestmark = pytest.mark.transfer

PROMPT = 300
P_LAYOUT, D_LAYOUT = pair(few_layers("llama-3.1-8b", 1), 1, 1)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[RankWorker]]:
    pool = start_workers(2, arena_bytes(P_LAYOUT, D_LAYOUT, PROMPT, 1))
    yield pool
    for w in pool:
        w.close()


@pytest.fixture
def loaded(workers):
    pairing = Pairing.place(workers, P_LAYOUT, D_LAYOUT, PROMPT)
    req = requests(P_LAYOUT, D_LAYOUT, PROMPT, 1)[0]
    pairing.load([req])
    return pairing, req


def edit_run(plan: TransferPlan, component: str, run: int, **arrays: int) -> TransferPlan:
    """The plan with one run of one component's run set moved (src=... / dst=... / length=...)."""
    out = []
    for rs in plan.runsets:
        if rs.component == component:
            changed = {}
            for name, value in arrays.items():
                column = getattr(rs, name).copy()
                column[run] = value
                changed[name] = column
            rs = replace(rs, **changed)
        out.append(rs)
    return replace(plan, runsets=tuple(out))


def pull_one(pairing: Pairing, plan: TransferPlan) -> dict:
    return pairing.pull([plan])[0][0]


def test_the_unedited_plan_succeeds(loaded):
    pairing, req = loaded
    report = pull_one(pairing, req.plan)
    assert report["ok"] and report["failedCount"] == 0 and report["entries"] == req.plan.entries
    assert pairing.verify([req]) == []


@pytest.mark.parametrize("side, column", [("remote", "src"), ("local", "dst")])
def test_out_of_range_run_is_refused_before_anything_moves(loaded, side, column):
    pairing, req = loaded
    region = pairing.peers[0].regions[("attention", "v", 0)][1]
    plan = edit_run(req.plan, "v", 1, **{column: region - 100})
    report = pull_one(pairing, plan)
    assert not report["ok"]
    assert report["entries"] == 0 and report["batches"] == 0
    assert report["notSubmitted"] == plan.entries
    (failure,) = report["failures"]
    assert failure["run"]["run"] == 1 and failure["run"]["component"] == "v"
    assert f"{side} run out of the {region}-byte region" in failure["message"]
    assert "prefill rank 0 -> decode rank 0, attention/v layer 0 run 1" in failure["message"]
    # Nothing was submitted, so decode memory is exactly as blank as before the pull.
    assert pairing.decode[0][0].call("verify", []) == []


def test_run_the_target_rejects_is_named(loaded):
    """The published regions claim memory the target never registered: the local checks pass, the
    engine returns -1 and the executor names the run it rejects."""
    pairing, req = loaded
    key = ("attention", "k", 0)
    base, size = pairing.peers[0].regions[key]
    lying = {**pairing.peers[0].regions, key: (base + (1 << 40), size)}
    report = pairing.decode[0][0].call("pull", req.plan, 0, {0: Peer(0, pairing.peers[0].segment, lying)})
    assert not report["ok"] and report["failedCount"] >= 1
    failure = report["failures"][0]
    assert "batch_transfer_sync_read returned -1" in failure["message"]
    assert failure["run"]["component"] == "k" and failure["run"]["prefill_rank"] == 0


def test_zero_length_runs_and_empty_components_are_skipped(loaded):
    pairing, req = loaded
    plan = req.plan
    padded = [replace(rs, src=np.append(rs.src, 0), dst=np.append(rs.dst, 0), length=np.append(rs.length, 0))
              for rs in plan.runsets]
    # An empty component (like NoPE MLA's rope) has no region on either side and moves nothing.
    empty = RunSet("attention", "attention", "rope", 0, 0, (0,), np.zeros(3, np.int64), np.zeros(3, np.int64),
                   np.zeros(3, np.int64))
    report = pull_one(pairing, replace(plan, runsets=(*padded, empty)))
    assert report["ok"], report["failures"]
    assert report["skippedZero"] == len(padded) + 3
    assert report["entries"] == plan.entries
    assert pairing.verify([req]) == []


def test_peer_gone(loaded):
    """Last in the module: the prefill rank process is killed, then decode pulls."""
    pairing, req = loaded
    pairing.prefill[0].process.kill()
    pairing.prefill[0].process.join()
    report = pull_one(pairing, req.plan)
    assert not report["ok"] and report["entries"] < req.plan.entries
    failure = report["failures"][0]
    assert "batch_transfer_sync_read returned -1" in failure["message"]
    assert f"from segment {pairing.peers[0].segment}" in failure["message"]
    assert failure["run"]["prefill_rank"] == 0 and failure["run"]["decode_rank"] == 0

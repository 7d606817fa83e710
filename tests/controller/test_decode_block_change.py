"""A decode-only block-size change rolls decode alone (issue 32): prefill's engines read nothing of
decode's block (vllm-ascend PR #16755 moves KV between unequal blocks in token runs), but its template
names decode's side twice, in the kv-layout label and in the revision config's pairing. The reconcile
keeps prefill on the revision its instances run when the spec with decode's block as that revision
recorded it renders it exactly (render/workloads.py with_running), and the new decode's kv-layout
pairs as prefill's (Templates.pairs): in the planner, the proxy's membership and the decode gates.
Pure: the render, and the real reconcile with an in-memory API client."""

from __future__ import annotations

import copy
import json

import pytest

from pd_operator.controller import gate, revisions
from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.controller.proxy_state import ProxyStateReader
from pd_operator.proxy.membership import parse_document
from pd_operator.render import workloads
from pd_operator.render.serving_config import PAIRING_KEY
from pd_operator.transfer.gate_state import Targets
from support.controller_fakes import MemoryClient, pods_with_volumes, reconciled_body, with_status
from support.renders import VALID_EXAMPLES, of_kind
from support.specs import example, resolve

EXAMPLE = "glm-5.3-flash-1p1d-tp4.yaml"
NAME = "glm-flash-1p1d"
"""Prefill TP4 and decode TP4, both on engine block 1152."""


def _body(**decode: object) -> dict:
    body = reconciled_body(EXAMPLE)
    body["spec"]["prefill"]["replicas"] = body["spec"]["decode"]["replicas"] = 2
    body["spec"]["decode"].update(decode)
    return body


def _changed(body: dict, **decode: object) -> dict:
    out = copy.deepcopy(body)
    out["spec"]["decode"].update(decode)
    out["metadata"]["generation"] = 2
    return out


def _running(ctx, rendered: workloads.Templates) -> dict[str, list[tuple[str, str]]]:
    return {role: [(ctx.tools_image, rendered.revisions[role])] * 2 for role in rendered.revisions}


def _kept(before: dict, after: dict) -> tuple[workloads.Templates, workloads.Templates]:
    """(the templates `before` runs, those the reconcile of `after` keeps), its configs observed."""
    old, new = resolve(before), resolve(after)
    running = workloads.templates(old)
    kept = workloads.with_running(new, workloads.templates(new), _running(old, running),
                                  revisions.decode_blocks(new, list(running.configs.values())))
    return running, kept


def test_a_decode_only_block_size_change_keeps_prefill_on_its_revision():
    body = _body()
    after = _changed(body, blockSize=2304)
    old, new = resolve(body), resolve(after)
    assert (old.engine_block_size("decode"), new.engine_block_size("decode")) == (1152, 2304)
    assert old.layout_hash != new.layout_hash
    fresh = workloads.templates(new)
    running, kept = _kept(body, after)
    assert fresh.revisions["prefill"] != running.revisions["prefill"], "the template names decode's side"
    assert kept.revisions["prefill"] == running.revisions["prefill"]
    assert kept.leaders["prefill"] == running.leaders["prefill"]
    assert kept.configs["prefill"] == running.configs["prefill"]
    for index in range(2):
        assert (workloads.stateful_set(new, "prefill", index, kept)
                == workloads.stateful_set(old, "prefill", index, running))
    assert kept.revisions["decode"] == fresh.revisions["decode"] != running.revisions["decode"]
    # The new decode's layout pairs as the prefill's it keeps.
    assert kept.pairs == {new.layout_hash: old.layout_hash}
    assert kept.paired(new.layout_hash) == kept.paired(old.layout_hash) == old.layout_hash


def test_what_prefill_s_engines_read_still_rolls_prefill():
    """Decode's TP is in prefill's kv_connector_extra_config (MooncakeConnectorV1 chooses its ranks
    by it), and prefill's own block is prefill's: both give prefill a new revision, and nothing pairs
    as another."""
    body = _body()
    for after in (_changed(body, tensorParallelSize=2), _changed(body, blockSize=2304, tensorParallelSize=2)):
        running, kept = _kept(body, after)
        assert kept.revisions["prefill"] != running.revisions["prefill"]
        assert kept.pairs == {} or resolve(after).layout_hash not in kept.pairs
    prefill_block = copy.deepcopy(body)
    prefill_block["spec"]["prefill"]["blockSize"] = 2304
    running, kept = _kept(body, prefill_block)
    assert kept.revisions["prefill"] != running.revisions["prefill"] and kept.pairs == {}


def test_without_another_decode_block_recorded_nothing_pairs_as_another():
    body = _body()
    running, kept = _kept(body, _changed(body, env=[{"name": "EXTRA", "value": "1"}]))
    assert kept.pairs == {} and kept.revisions["prefill"] == running.revisions["prefill"]
    assert kept.revisions["decode"] != running.revisions["decode"]


def _created(body: dict) -> list[dict]:
    first = MemoryClient()
    reconcile_mod.reconcile(first, ProxyStateReader(), body, [], [])  # type: ignore[arg-type]
    return with_status([m for verb, m in first.writes if verb in ("apply", "create")])


def _applied(client: MemoryClient, kind: str) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for verb, m in client.writes if verb == "apply" and m["kind"] == kind}


def _membership(client: MemoryClient) -> dict:
    return json.loads(_applied(client, "ConfigMap")[f"{NAME}-proxy"]["data"]["upstreams.json"])


def test_the_reconcile_rolls_decode_alone_and_the_new_decode_pairs_with_the_old_prefill():
    """The whole reconcile: the children and pods of the spec before, then the reconcile that surges
    the first new decode, then the next with it Ready beside the old ones."""
    body = _body()
    after = _changed(body, blockSize=2304)
    old, new = resolve(body), resolve(after)
    children = _created(body)
    pods = pods_with_volumes(children)
    surging = MemoryClient()
    reconcile_mod.reconcile(surging, ProxyStateReader(), after, children, pods)  # type: ignore[arg-type]
    sets = _applied(surging, "StatefulSet")
    assert set(sets) == {f"{NAME}-decode-2"}, "no prefill instance is written a new template"
    written = [m["metadata"]["name"] for verb, m in surging.writes if verb == "apply"]
    assert not [name for name in written if name.startswith(f"{NAME}-prefill")], written
    assert not [w for w in surging.writes if w[0] == "delete-pod"]
    (status,) = [s for verb, s in surging.writes if verb == "status"]
    prefill_revision = {s["spec"]["template"]["metadata"]["labels"]["pd.serving.dev/revision"]
                        for s in of_kind(children, "StatefulSet") if "-prefill-" in s["metadata"]["name"]}
    assert {status["prefill"]["revision"]} == prefill_revision
    assert status["prefill"]["updatedInstances"] == 2
    assert sets[f"{NAME}-decode-2"]["metadata"]["labels"]["pd.serving.dev/kv-layout"] == new.layout_hash

    new_decode = with_status(list(sets.values()))
    both = MemoryClient()
    reconcile_mod.reconcile(both, ProxyStateReader(), after, children + new_decode,  # type: ignore[arg-type]
                            pods + pods_with_volumes(new_decode))
    doc = _membership(both)
    assert doc["pairs"] == {new.layout_hash: old.layout_hash}
    # Every member is listed by the kv-layout its pods run (an older gate knows no `pairs`) ...
    # With the surge decode serving, an old decode leaves (no proxy to wait for here: it is replaced
    # at once), and no prefill does.
    (replaced,) = {name.rsplit("-", 1)[0] for verb, name in both.writes if verb == "delete-pod"}
    assert replaced in (f"{NAME}-decode-0", f"{NAME}-decode-1")
    listed = {u["name"]: u["layout"] for u in doc["decode"]}
    assert listed == {**{name: old.layout_hash for name in (f"{NAME}-decode-0", f"{NAME}-decode-1")
                         if name != replaced}, f"{NAME}-decode-2": new.layout_hash}
    assert {u["layout"] for u in doc["prefill"]} == {old.layout_hash}
    # ... the prefills keep the spec's prefix block (their engines are the spec's) ...
    assert {u.get("blockTokens") for u in doc["prefill"]} == {new.prefix_hit_tokens("prefill")}
    # ... and the proxy pairs the new decode with them, as the new decode's gate links them.
    membership = parse_document(doc)
    assert {u.name for u in membership.pairable("decode", old.layout_hash)} == set(listed)
    assert f"{NAME}-decode-2" in listed
    new_gate = Targets(layout=new.layout_hash, membership=membership)
    assert set(new_gate.members()) == {f"{NAME}-prefill-0", f"{NAME}-prefill-1"}
    old_gate = Targets(layout=old.layout_hash, membership=membership)
    assert set(old_gate.members()) == {f"{NAME}-prefill-0", f"{NAME}-prefill-1"}


def test_the_planner_sees_the_new_decode_pair_with_the_old_prefill():
    body = _body()
    after = _changed(body, blockSize=2304)
    old, new = resolve(body), resolve(after)
    running, kept = _kept(body, after)
    fresh_decode = workloads.stateful_set(new, "decode", 2, kept)
    before = [workloads.stateful_set(old, role, i, running) for role in ("prefill", "decode")
              for i in range(2)]
    pods = pods_with_volumes([*before, fresh_decode])
    state = gate.observe(new, kept.revisions, pods, (), None, kept.pairs)
    assert {s.layout for role in state for s in state[role].values()} == {old.layout_hash}
    assert state["decode"][2].label == new.layout_hash and state["decode"][0].label is None
    assert all(s.updated for s in state["prefill"].values())
    # Without the pairs, the new decode would pair with nothing.
    apart = gate.observe(new, kept.revisions, pods, (), None)
    assert apart["decode"][2].layout == new.layout_hash != apart["prefill"][0].layout


def _leaves(obj, path: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in _leaves(value, f"{path}.{key}").items()}
    if isinstance(obj, list):
        return {k: v for i, value in enumerate(obj) for k, v in _leaves(value, f"{path}[{i}]").items()}
    return {path: obj}


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_prefill_s_engines_read_nothing_of_decode_s_block(path):
    """What keeping prefill on its revision rests on, for every example: decode's block changes
    prefill's template only in its kv-layout label and the name of its revision config, and that
    config only in its pairing (both sides' shapes), never in what prefill's engines or pd-preflight
    read. Were it to enter prefill's command, the reconcile would keep prefill on the old one."""
    doc = example(path)
    other = copy.deepcopy(doc)
    other["spec"]["decode"]["blockSize"] = 2 * resolve(doc).engine_block_size("decode")
    before, after = workloads.templates(resolve(doc)), workloads.templates(resolve(other))
    old, new = _leaves(before.leaders["prefill"]), _leaves(after.leaders["prefill"])
    differ = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
    assert differ <= {".metadata.labels.pd.serving.dev/kv-layout", ".metadata.labels.pd.serving.dev/revision",
                      *(k for k in old if k.endswith("configMap.name"))}, differ
    data = (before.configs["prefill"]["data"], after.configs["prefill"]["data"])
    assert {key for key in data[0] if data[0][key] != data[1][key]} == {PAIRING_KEY}

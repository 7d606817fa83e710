"""An operator upgrade restarts no engine by itself (issue 32 item 5, issue 33): the serving pods'
templates carry the operator image (the pd-tools init container), so a new `--tools-image` alone
would give every role a new revision and roll every engine in the cluster. The reconcile keeps a
role on the tools its instances run while nothing else of its template changed
(render/workloads.py with_running_tools); the new tools come with the next template change, or at
once with spec.image.toolsUpdate: WithOperator; the status names the instances on older tools."""

from __future__ import annotations

from typing import Any

import pytest

from pd_operator.api.labels import REVISION, ROLE
from pd_operator.api.types import ROLES
from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.controller.proxy_state import ProxyStateReader
from pd_operator.render import tools, workloads
from pd_operator.render.pod import pod_template
from pd_operator.render.runnable import validate
from pd_operator.spec.validate import Resolved
from support.controller_fakes import MemoryClient, pods_of, with_status
from support.helm_chart import operator_args
from support.specs import example

OLD = "ghcr.io/pd-serving/pd-operator:0.9.0"
NEW = "ghcr.io/pd-serving/pd-operator:1.0.0"
EXAMPLE = "glm-5.3-flash-1p1d-tp4.yaml"
UID = "0b1c2d3e-0000-4000-8000-000000000003"


def _doc(**image: Any) -> dict:
    doc = example(EXAMPLE)
    doc["metadata"] |= {"namespace": "default", "uid": UID, "generation": 1}
    doc["spec"]["image"] |= image
    for role in ROLES:
        doc["spec"][role]["replicas"] = 2
    return doc


def _resolved(doc: dict, tools_image: str) -> Resolved:
    validation = validate(doc, tools_image=tools_image)
    assert validation.resolved is not None, validation.errors
    return validation.resolved


def _running(ctx: Resolved, rendered: workloads.Templates) -> dict[str, list[tuple[str, str]]]:
    return {role: [(ctx.tools_image, rendered.revisions[role])] * 2 for role in ROLES}


def _tools_image(stateful_set: dict) -> str:
    (init,) = [c for c in stateful_set["spec"]["template"]["spec"]["initContainers"]
               if c["name"] == tools.INIT_CONTAINER]
    return str(init["image"])


def test_a_new_tools_image_alone_keeps_every_engine_template():
    before = _resolved(_doc(), OLD)
    running = workloads.templates(before)
    after = _resolved(_doc(), NEW)
    fresh = workloads.templates(after)
    assert fresh.revisions != running.revisions, "the tools image is part of the template"
    kept = workloads.with_running(after, fresh, _running(before, running))
    assert kept.revisions == running.revisions
    for role in ROLES:
        for index in range(2):
            assert (workloads.stateful_set(after, role, index, kept)
                    == workloads.stateful_set(before, role, index, running))
            assert _tools_image(workloads.stateful_set(after, role, index, kept)) == OLD


def test_the_opt_in_rolls_the_new_tools():
    before = _resolved(_doc(toolsUpdate="WithOperator"), OLD)
    running = workloads.templates(before)
    after = _resolved(_doc(toolsUpdate="WithOperator"), NEW)
    kept = workloads.with_running(after, workloads.templates(after), _running(before, running))
    assert all(kept.revisions[role] != running.revisions[role] for role in ROLES)
    assert all(_tools_image(workloads.stateful_set(after, role, 1, kept)) == NEW for role in ROLES)


def test_the_next_template_change_brings_the_new_tools():
    before = _resolved(_doc(), OLD)
    running = workloads.templates(before)
    changed = _doc()
    changed["spec"]["decode"]["env"] = [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
    after = _resolved(changed, NEW)
    kept = workloads.with_running(after, workloads.templates(after), _running(before, running))
    assert kept.revisions["prefill"] == running.revisions["prefill"]
    assert _tools_image(workloads.stateful_set(after, "prefill", 0, kept)) == OLD
    assert kept.revisions["decode"] != running.revisions["decode"]
    assert _tools_image(workloads.stateful_set(after, "decode", 0, kept)) == NEW


def test_older_tools_never_read_a_config_this_operator_writes_differently():
    """The template names its revision config by a hash of its data: a running revision whose
    config this operator would write differently (as an older operator wrote it, say) is no
    template this operator renders with the older tools, so the new tools come with the new config."""
    before = _resolved(_doc(), OLD)
    after = _resolved(_doc(), NEW)
    fresh = workloads.templates(after)
    running = {}
    for role in ROLES:
        other_config = f"{fresh.configs[role]['metadata']['name']}-older"
        running[role] = [(OLD, workloads.revision(pod_template(before, role, 0, other_config)))] * 2
    assert workloads.with_running(after, fresh, running) == fresh


def _pods(children: list[dict]) -> list[dict]:
    """pods_of with each pod's init containers, as its StatefulSet's template has them."""
    init = {c["metadata"]["name"]: c["spec"]["template"]["spec"].get("initContainers", [])
            for c in children if c["kind"] == "StatefulSet"}
    pods = pods_of(children)
    for pod in pods:
        owner = pod["metadata"]["name"].rpartition("-")[0]
        pod.setdefault("spec", {})["initContainers"] = init.get(owner, [])
    return pods


DIGEST = "sha256:" + "5" * 64


def _chart_tools_image(*settings: str) -> str:
    """The --tools-image the chart passes the operator with these `--set` settings."""
    (arg,) = [a for a in operator_args(*settings) if a.startswith("--tools-image=")]
    return arg.partition("=")[2]


# An operator upgrade is a new tools image: a new tag, or the admin pinning the operator image by its
# digest (the chart's image.digest) so that a tag pushed again cannot change what every engine runs.
UPGRADES = {"new-tag": lambda: (OLD, NEW),
            "to-its-digest": lambda: (_chart_tools_image(), _chart_tools_image(f"image.digest={DIGEST}"))}


@pytest.mark.parametrize("upgrade", UPGRADES)
@pytest.mark.parametrize(("tools_update", "rolls"), [("WithNextChange", False), ("WithOperator", True)])
def test_an_operator_upgrade_restarts_no_engine_and_says_so(upgrade, tools_update, rolls):
    """The whole reconcile, with an in-memory API: the children and pods an old operator made, then
    the reconcile of the new one; switching the tools image to its digest restarts no engine either."""
    old, new = UPGRADES[upgrade]()
    assert new != old and (upgrade != "to-its-digest" or new == f"{old}@{DIGEST}")
    body = _doc(toolsUpdate=tools_update)
    first = MemoryClient()
    reconcile_mod.reconcile(first, ProxyStateReader(), body, [], [], tools_image=old)  # type: ignore[arg-type]
    children = with_status([m for verb, m in first.writes if verb in ("apply", "create")])
    upgraded = MemoryClient()
    reconcile_mod.reconcile(upgraded, ProxyStateReader(), body, children, _pods(children),  # type: ignore[arg-type]
                            tools_image=new)
    written = [m for verb, m in upgraded.writes if verb == "apply" and m["kind"] == "StatefulSet"]
    (status,) = [s for verb, s in upgraded.writes if verb == "status"]
    (tools_current,) = [c for c in status["conditions"] if c["type"] == "ToolsCurrent"]
    replaced = [name for verb, name in upgraded.writes if verb == "delete-pod"]
    if rolls:  # the rollout starts: the new tools reach the templates, and with the default rollout
        # (one surge instance per role, none unavailable) a surge instance of each role comes up first
        surge = {f"{body['metadata']['name']}-{role}-2" for role in ROLES}
        assert written and all(_tools_image(m) == new for m in written)
        assert surge <= {m["metadata"]["name"] for m in written} and replaced == []
        assert status["prefill"]["revision"] != children_revision(children, "prefill")
    else:
        assert written == [] and replaced == [], [m["metadata"]["name"] for m in written]
        assert status["prefill"]["revision"] == children_revision(children, "prefill")
    assert tools_current["status"] == "False" and tools_current["reason"] == "OlderTools"
    assert "spec.image.toolsUpdate" in tools_current["message"]
    for role in ROLES:
        instances = status[role]["instances"]
        # Every instance (rolling: those this pass did not replace yet).
        assert len(instances) == 2 or (rolls and instances), instances
        assert {i["tools"] for i in instances} == {old}
        assert all(i["name"] in tools_current["message"] for i in instances)


def children_revision(children: list[dict], role: str) -> str:
    (revision,) = {c["spec"]["template"]["metadata"]["labels"][REVISION] for c in children
                   if c["kind"] == "StatefulSet" and c["metadata"]["labels"].get(ROLE) == role}
    return str(revision)

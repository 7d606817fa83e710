"""One reconcile derives each fact once: the kv-layout hash is computed by the validator (spec/layout.py)
and read from the Resolved afterwards, and the proxy's membership ConfigMap is rendered once, from the
gate's routable set (never rendered in full and then edited). Counted on the real reconcile with an
in-memory API client."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pd_operator.api.types import PDDeploymentStatus
from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.controller import rollout
from pd_operator.controller.proxy_state import ProxyStateReader
from pd_operator.render import proxy as render_proxy
from pd_operator.render import workloads
from pd_operator.spec import validate as validate_mod
from support.controller_fakes import MemoryClient, pods_of, reconciled_body, with_status


@pytest.mark.parametrize("example", ["glm-5.3-flash-tp8-dp2tp4.yaml", "glm-5.3-flash-1p1d-tp4.yaml"])
def test_a_reconcile_hashes_the_layout_once_and_renders_the_membership_once(example, monkeypatch):
    counts = {"layout_hash": 0, "membership_config_map": 0}

    def counting(module: Any, name: str) -> None:
        real = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, wrapper)

    counting(validate_mod, "layout_hash")
    counting(render_proxy, "membership_config_map")
    client = MemoryClient()
    outcome = reconcile_mod.reconcile(client, ProxyStateReader(), reconciled_body(example), [], [])  # type: ignore[arg-type]
    assert counts == {"layout_hash": 1, "membership_config_map": 1}
    applied = [m for verb, m in client.writes if verb in ("apply", "create")]
    assert any(m["kind"] == "StatefulSet" for m in applied) and outcome.applied
    # No pod is Ready yet, so the gate lists no instance: the membership written is the gated one.
    (membership,) = [m for m in applied
                     if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-proxy")]
    listed = yaml.safe_load(membership["data"]["upstreams.json"])
    assert listed["prefill"] == [] and listed["decode"] == []
    # The status written (a merge patch: null removes a key) reads back through its model.
    (patch,) = [status for verb, status in client.writes if verb == "status"]
    written = {k: v for k, v in patch.items() if v is not None}
    assert PDDeploymentStatus.model_validate(written).to_wire() == written


@pytest.mark.parametrize(("example", "instances"), [("glm-5.3-flash-1p1d-tp4.yaml", 1),
                                                    ("glm-5.3-flash-1p1d-tp4.yaml", 4),
                                                    ("glm-5.3-flash-tp8-dp2tp4.yaml", 2)])
def test_a_reconcile_renders_each_pod_template_once_and_computes_each_revision_once(
        example, instances, monkeypatch):
    """The image check, the StatefulSets, the gate, the rollout and the status all take the
    templates and revisions rendered once (render/workloads.py Templates): one render per distinct
    pod template (one per instance), one revision per role; the rollout figures once. On a first
    reconcile and on the next one, once the pods run."""
    renders: list[tuple[str, int]] = []
    revisions: list[str] = []
    figures: list[int] = []
    real_template, real_revision, real_figures = workloads.pod_template, workloads.revision, rollout.figures

    def pod_template(ctx: Any, role: str, index: int, config: str) -> dict:
        renders.append((role, index))
        return real_template(ctx, role, index, config)

    def revision(template: dict) -> str:
        out = real_revision(template)
        revisions.append(out)
        return out

    def count_figures(*args: Any) -> Any:
        figures.append(1)
        return real_figures(*args)

    monkeypatch.setattr(workloads, "pod_template", pod_template)
    monkeypatch.setattr(workloads, "revision", revision)
    monkeypatch.setattr(rollout, "figures", count_figures)
    body = reconciled_body(example)
    for role in ("prefill", "decode"):
        body["spec"][role]["replicas"] = instances
    distinct = {(role, i) for role in ("prefill", "decode") for i in range(instances)}

    client = MemoryClient()
    reconcile_mod.reconcile(client, ProxyStateReader(), body, [], [])  # type: ignore[arg-type]
    assert sorted(renders) == sorted(distinct) and len(revisions) == len(set(revisions)) == 2
    assert len(figures) == 1

    applied = [m for verb, m in client.writes if verb in ("apply", "create")]
    renders.clear(), revisions.clear(), figures.clear()
    reconcile_mod.reconcile(MemoryClient(), ProxyStateReader(), body, applied,  # type: ignore[arg-type]
                            pods_of(with_status(applied)))
    assert sorted(renders) == sorted(distinct) and len(revisions) == 2 and len(figures) == 1


def test_a_first_reconcile_applies_roles_before_their_bindings_and_the_workloads_last():
    """The applies go out in waves, each at once: a RoleBinding's Role must exist (the API server's
    escalation check reads it) and a workload's pods need the rest (ServiceAccount, ConfigMaps)."""
    client = MemoryClient()
    body = reconciled_body("glm-5.3-flash-tp8-dp2tp4.yaml")
    reconcile_mod.reconcile(client, ProxyStateReader(), body, [], [])  # type: ignore[arg-type]
    kinds = [m["kind"] for verb, m in client.writes if verb in ("apply", "create")]
    workloads = {"StatefulSet", "Deployment"}

    def last(wanted: set[str]) -> int:
        return max(i for i, kind in enumerate(kinds) if kind in wanted)

    def first(wanted: set[str]) -> int:
        return min(i for i, kind in enumerate(kinds) if kind in wanted)

    assert last({"Role"}) < first({"RoleBinding"})
    assert last(set(kinds) - workloads) < first(workloads)

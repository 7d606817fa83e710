"""Revisions as objects (issue 32): what a revision's pods read lives in immutable ConfigMaps named by
it, which its pod template names, kept while a pod or StatefulSet of it remains. Pure: the render,
and the real reconcile with an in-memory API client."""

from __future__ import annotations

import copy
import json

from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.controller.proxy_state import ProxyStateReader
from pd_operator.render import render, workloads
from support.controller_fakes import RECONCILED_UID, MemoryClient, pods_of, reconciled_body, with_status
from support.renders import of_kind, serving_sets
from support.specs import example, resolve


def _configs(manifests: list[dict]) -> dict[str, dict]:
    """Per role: its revision config."""
    return {m["metadata"]["labels"]["pd.serving.dev/role"]: m for m in of_kind(manifests, "ConfigMap")
            if m.get("immutable")}


def _mounted(sts: dict) -> str:
    (name,) = [v["configMap"]["name"] for v in sts["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "pd-serving"]
    return name


def test_each_role_mounts_an_immutable_config_named_by_its_content():
    manifests = render(resolve(example()))
    configs = _configs(manifests)
    assert set(configs) == {"prefill", "decode"}
    for sts in serving_sets(manifests):
        role = sts["metadata"]["labels"]["pd.serving.dev/role"]
        assert _mounted(sts) == configs[role]["metadata"]["name"]
        assert configs[role]["metadata"]["name"].startswith(f"glm-flash-{role}-")
        assert f"preflight-{role}.json" in configs[role]["data"] and "pairing.json" in configs[role]["data"]
    # Nothing serving pods mount is edited in place: no mutable serving ConfigMap remains (the proxy's
    # membership is the proxy's, not a revision's).
    mutable = [m["metadata"]["name"] for m in of_kind(manifests, "ConfigMap") if not m.get("immutable")]
    assert mutable == ["glm-flash-proxy"]


def test_a_change_of_what_pods_read_is_a_new_config_and_revision_and_scaling_is_neither():
    doc = example()
    before = workloads.templates(resolve(doc))
    tp = copy.deepcopy(doc)
    tp["spec"]["decode"]["dataParallelSize"] = 4
    after = workloads.templates(resolve(tp))
    for role in ("prefill", "decode"):  # the pairing both probes read changed
        assert after.configs[role]["metadata"]["name"] != before.configs[role]["metadata"]["name"]
        assert after.revisions[role] != before.revisions[role]
    env = copy.deepcopy(doc)
    env["spec"]["decode"].setdefault("env", []).append({"name": "EXTRA", "value": "1"})
    changed = workloads.templates(resolve(env))
    assert changed.configs["decode"]["metadata"]["name"] == before.configs["decode"]["metadata"]["name"]
    assert changed.revisions["decode"] != before.revisions["decode"]
    for proxy in (True, False):  # the decode gates' peers are no part of a revision, with or without proxy
        base = copy.deepcopy(doc)
        base["spec"]["proxy"] = {"enabled": proxy}
        scaled = copy.deepcopy(base)
        scaled["spec"]["prefill"]["replicas"] = 3
        assert workloads.templates(resolve(scaled)).revisions == workloads.templates(resolve(base)).revisions


class PruningClient(MemoryClient):
    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []

    def get_child(self, manifest: dict) -> dict | None:
        return None

    def delete(self, obj: dict) -> None:
        self.deleted.append(f"{obj['kind']}/{obj['metadata']['name']}")

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete-pod", name))

    def annotate_stateful_set(self, namespace: str, name: str, annotations: dict) -> dict:
        raise AssertionError("no group restart here")


def _running(applied: list[dict]) -> list[dict]:
    """Ready pods of the StatefulSets `applied` holds, each with its template's volumes."""
    out = []
    specs = {s["metadata"]["name"]: s["spec"]["template"]["spec"]
             for s in applied if s["kind"] == "StatefulSet"}
    for pod in pods_of(with_status(applied)):
        owner = pod["metadata"]["name"].rsplit("-", 1)[0]
        pod["spec"] = copy.deepcopy(specs.get(owner, {}))
        out.append(pod)
    return out


def _owned(objs: list[dict]) -> list[dict]:
    out = copy.deepcopy(objs)
    for o in out:
        o["metadata"]["ownerReferences"] = [{"uid": RECONCILED_UID, "controller": True}]
    return out


def test_an_old_revision_config_stays_while_a_pod_mounts_it_and_goes_after():
    body = reconciled_body("glm-5.3-flash-1p1d-tp4.yaml")
    first = PruningClient()
    reconcile_mod.reconcile(first, ProxyStateReader(), body, [], [])  # type: ignore[arg-type]
    children = _owned([m for verb, m in first.writes if verb in ("apply", "create")])
    pods = _running(children)
    old = {m["metadata"]["name"] for m in children if m.get("immutable")}

    changed = copy.deepcopy(body)
    changed["spec"]["decode"]["tensorParallelSize"] = 2
    changed["metadata"]["generation"] = 2
    second = PruningClient()
    reconcile_mod.reconcile(second, ProxyStateReader(), changed, children, pods)  # type: ignore[arg-type]
    created = {m["metadata"]["name"] for verb, m in second.writes if verb == "apply" and m.get("immutable")}
    assert created and not created & old  # the new revision's configs are new objects
    assert not [d for d in second.deleted if d.split("/")[1] in old], second.deleted  # old pods mount them

    # Once no pod and no StatefulSet names the old configs, they are collected.
    applied = {m["metadata"]["name"]: m for verb, m in second.writes if verb == "apply"}
    now = _owned([applied.get(c["metadata"]["name"], c) for c in children]
                 + [m for n, m in applied.items() if n not in {c["metadata"]["name"] for c in children}])
    for sts in of_kind(now, "StatefulSet"):
        assert _mounted(sts) not in old
    third = PruningClient()
    reconcile_mod.reconcile(third, ProxyStateReader(), changed, now, [])  # type: ignore[arg-type]
    assert {d.split("/")[1] for d in third.deleted if d.startswith("ConfigMap/")} == old
    assert json.dumps(sorted(old))  # named, not empty

"""Revision objects: what each revision's pods read lives in immutable objects named by it, kept
while a pod or StatefulSet of that revision remains, and each instance stays on its own revision until
the rollout moves it. Pure.

A role's revision config (render/serving_config.py: preflight config and KV-link pairing) is an
immutable ConfigMap named by a hash of its data, and the role's pod template names it, so the
template's revision (render/workloads.py) covers it. The spec moving on does not remove it: an old
pod whose container restarts, or that its StatefulSet recreates on the old template, still mounts
its own revision's config (as a StatefulSet's ControllerRevisions keep each revision's template,
kubernetes: pkg/controller/history/controller_history.go @ v1.36.3). The reconcile's prune leaves a
revision config any observed pod or StatefulSet still names, and deletes it once none does.

An instance's revision record: a ControllerRevision (`<instance>-rev-<hash of its data>`, owned by
the PDDeployment, its `data` immutable as the API server keeps every ControllerRevision's,
kubernetes: pkg/apis/apps/validation/validation.go ValidateControllerRevisionUpdate @ v1.36.3) holding
the instance's whole StatefulSet manifest and the revision config its pods mount. Its `revision`
number orders an instance's records as a StatefulSet's ControllerRevisions are ordered: the highest is
the revision the instance is on (kubernetes: pkg/controller/history/controller_history.go @ v1.36.3).
`pin` writes an instance's StatefulSet with the role's current template only when it is new, already
on it, or the rollout replaces its pods in this reconcile (its drain done); any other instance's
StatefulSet is written from its own record, so under OnDelete a pod evicted or crashed comes back on
the instance's own revision, a paused, partitioned or halted rollout moves nothing pod by pod, and a
StatefulSet deleted or edited by hand comes back as its record says, after an operator restart too
(the records are in the cluster). Such an instance's PodGroup (spec.scheduling.gang) is the one its
record's StatefulSet names and fills, derived from it (render/scheduling.py recorded_pod_group), so a
pod of it recreated mid-rollout finds its group, of its own pod count, where one of the spec's
would name a group no longer rendered (kube-scheduler's) or wait for more pods than its StatefulSet
runs (Volcano's minMember); the records themselves hold no PodGroup. Per instance,
spec.<role>.rollout.revisionHistoryLimit bounds the records of revisions no pod of it runs; an
instance's records go with it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Collection, Iterable, Mapping

from pd_operator.api.labels import RECORDED_REVISION, REVISION, ROLE
from pd_operator.api.types import ROLES, RoleSpec
from pd_operator.controller.diff import is_owned_by
from pd_operator.controller.drain import instance_of
from pd_operator.controller.pods import by_instance, is_terminating, label
from pd_operator.names import Names
from pd_operator.render import scheduling
from pd_operator.render.serving_config import PAIRING_KEY
from pd_operator.spec.validate import DECODE_BLOCK, Resolved, with_decode_block

Key = tuple[str, int]
"""(role, index): an instance."""
DIGEST_CHARS = 10


def is_config(obj: dict) -> bool:
    """A role's revision config (render/serving_config.py config_maps)."""
    return obj.get("kind") == "ConfigMap" and label(obj, ROLE) in ROLES and bool(obj.get("immutable"))


def _named_configs(pod_spec: dict) -> Iterable[str]:
    for volume in pod_spec.get("volumes") or []:
        if name := (volume.get("configMap") or {}).get("name"):
            yield name


def in_use(children: Iterable[dict], pods: Iterable[dict]) -> set[str]:
    """The ConfigMaps an observed pod or StatefulSet template mounts (a terminating pod too: it may
    still restart a container)."""
    out: set[str] = set()
    for pod in pods:
        out.update(_named_configs(pod.get("spec") or {}))
    for obj in children:
        if obj.get("kind") == "StatefulSet":
            out.update(_named_configs(((obj.get("spec") or {}).get("template") or {}).get("spec") or {}))
    return out


def kept(obj: dict, used: set[str]) -> bool:
    """Whether a child the spec no longer wants stays: a revision config still in use."""
    return is_config(obj) and obj["metadata"]["name"] in used


def decode_blocks(resolved: Resolved, children: Iterable[dict]) -> list[Resolved]:
    """The spec with each other decode block a revision config of it records (its pairing's
    spec.decode: render/serving_config.py), where that pairing is servable (spec/validate.py
    with_decode_block): what render/workloads.py with_running keeps prefill's engines on and pairs
    kv-layouts by after a decode-only block-size change. Read once per reconcile."""
    def block(decode: RoleSpec) -> tuple:
        return tuple(getattr(decode, name) for name in DECODE_BLOCK)

    seen, out = {block(resolved.role("decode"))}, []
    for obj in children:
        if not is_config(obj):
            continue
        try:
            decode = RoleSpec.model_validate(json.loads(obj["data"][PAIRING_KEY])["spec"]["decode"])
        except (KeyError, TypeError, ValueError):  # not a pairing this operator wrote; pydantic's too
            continue
        if block(decode) not in seen:
            seen.add(block(decode))
            if (other := with_decode_block(resolved, decode)) is not None:
                out.append(other)
    return out


def is_record(obj: dict) -> bool:
    """An instance's revision record (only ours carry RECORDED_REVISION)."""
    return obj.get("kind") == "ControllerRevision" and label(obj, RECORDED_REVISION) is not None


History = Mapping[Key, list[dict]]
"""Per instance: its records, oldest first (records)."""


def records(children: list[dict], pods: Iterable[dict], owner_uid: str) -> dict[Key, list[dict]]:
    """Per instance: its owned records, oldest first (by their `revision` number), but none of an
    instance never applied (_applied). Read once per reconcile and passed to pin, kept_records and
    running."""
    out: dict[Key, list[dict]] = {}
    for obj in children:
        if is_record(obj) and is_owned_by(obj, owner_uid) and not is_terminating(obj) \
                and (inst := instance_of(obj)) is not None:
            out.setdefault(inst, []).append(obj)
    for found in out.values():
        found.sort(key=lambda r: int(r.get("revision") or 0))
    return _applied(out, children, pods)


def _applied(history: dict[Key, list[dict]], children: list[dict], pods: Iterable[dict]
             ) -> dict[Key, list[dict]]:
    """`history` without the instances whose newest record was never applied: no StatefulSet, no pod
    (a terminating one counts) and not the PodGroup that record's pods name. An apply writes the
    PodGroup before the StatefulSet, so such a record ran nothing: one an operator wrote beside the
    PodGroups before records had their own wave (reconcile.py LATER_WAVES), when a PodGroup kind the
    cluster does not serve stopped the apply. Pinned to it, the instance would ask for that group for
    good; it takes the spec's revision instead, and the prune collects the records. An instance whose
    StatefulSet was deleted, its pods gone too (the operator down meanwhile), still has its group and
    so keeps its revision; so does one without a gang."""
    groups = {(obj["apiVersion"], obj["metadata"]["name"]) for obj in children if obj["kind"] == "PodGroup"}
    sets = {inst for obj in children
            if obj["kind"] == "StatefulSet" and (inst := instance_of(obj)) is not None}
    running = {inst for pod in pods if (inst := instance_of(pod)) is not None}
    return {inst: found for inst, found in history.items()
            if inst in sets or inst in running
            or (group := scheduling.named_group(found[-1]["data"]["statefulSet"]["spec"]["template"])) is None
            or group in groups}


def record(names: Names, stateful_set: dict, config: dict) -> dict:
    """The record of `stateful_set` (as rendered) and the revision config it mounts, without its
    `revision` number (numbered: pin)."""
    data = {"statefulSet": stateful_set, "config": config}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    role, index = instance_of(stateful_set) or ("", 0)
    meta = stateful_set["metadata"]
    template_labels = stateful_set["spec"]["template"]["metadata"]["labels"]
    return {"apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {"name": names.revision_record(role, index,
                                                       hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]),
                         "namespace": meta["namespace"],
                         "labels": {**meta["labels"], RECORDED_REVISION: template_labels[REVISION]}},
            "data": data}


def _number(found: list[dict], name: str) -> int:
    """The `revision` number of the record `name` as the instance's newest: its own when it is the
    newest already, else one above the highest (a revision the instance ran before and returns to,
    as a StatefulSet's rollback renumbers its old ControllerRevision)."""
    if found and found[-1]["metadata"]["name"] == name:
        return int(found[-1].get("revision") or 1)
    return max((int(r.get("revision") or 0) for r in found), default=0) + 1


def pin(ctx: Resolved, manifests: list[dict], history: History, revisions: Mapping[str, str],
        moving: Collection[Key]) -> list[dict]:
    """`manifests` (the render, every instance on its role's current revision) with each instance's
    StatefulSet on its own revision, and the records to write. An instance takes the current
    template (and its record, numbered newest) when it has no record (a new instance, a surge one, or
    one from before records), its newest record is of the current revision already, or it is in
    `moving` (the rollout replaces its pods now); any other keeps the StatefulSet and revision config
    of its newest record, and the PodGroup that StatefulSet's pods need (render/scheduling.py
    recorded_pod_group: its name, its pod count), not the spec's. `history`: the instances' records
    (records); `revisions`: each role's current revision."""
    configs = {label(m, ROLE): m for m in manifests if is_config(m)}
    kept: dict[Key, dict] = {}
    for manifest in manifests:
        if manifest["kind"] == "StatefulSet" and (inst := instance_of(manifest)) is not None \
                and (found := history.get(inst)) and inst not in moving \
                and label(found[-1], RECORDED_REVISION) != revisions[inst[0]]:
            kept[inst] = found[-1]
    out: list[dict] = []
    seen: set[str] = set()

    def add(manifest: dict | None) -> None:
        if manifest is None:
            return
        ident = f"{manifest['kind']}/{manifest['metadata']['name']}"
        if ident not in seen:
            seen.add(ident)
            out.append(manifest)

    for manifest in manifests:
        inst = instance_of(manifest) if manifest["kind"] in ("StatefulSet", "PodGroup") else None
        own = kept.get(inst) if inst is not None else None
        if inst is None or own is None:
            if inst is not None and manifest["kind"] == "StatefulSet":
                new = record(ctx.names, manifest, configs[inst[0]])
                add({**new, "revision": _number(history.get(inst, []), new["metadata"]["name"])})
            add(manifest)
        elif manifest["kind"] == "StatefulSet":  # the spec's PodGroup of a kept instance is left out
            data = copy.deepcopy(own["data"])
            add(data["config"])
            add(scheduling.recorded_pod_group(ctx, *inst, data["statefulSet"]))
            add(data["statefulSet"])
    return out


def kept_records(history: History, pods: Iterable[dict], desired: Iterable[dict],
                 limits: Mapping[str, int]) -> set[str]:
    """The records a prune leaves, of instances `desired` still has a StatefulSet for: each one's
    newest (the revision it is on), those of a revision its pods run, and of the others the newest
    `limits[role]` (spec.<role>.rollout.revisionHistoryLimit). The records of an instance the spec
    no longer has go with its StatefulSet (a drain holds both)."""
    wanted = {of_sts for m in desired
              if m["kind"] == "StatefulSet" and (of_sts := instance_of(m)) is not None}
    running: dict[Key, set[str]] = {}
    for pod in pods:
        if (of_pod := instance_of(pod)) is not None:
            running.setdefault(of_pod, set()).add(label(pod, REVISION) or "")
    out: set[str] = set()
    for inst, found in history.items():
        if inst not in wanted:
            continue
        *older, newest = found
        out.add(newest["metadata"]["name"])
        rest = [r for r in older if label(r, RECORDED_REVISION) not in running.get(inst, set())]
        out |= {r["metadata"]["name"] for r in older if r not in rest}
        limit = limits[inst[0]]
        out |= {r["metadata"]["name"] for r in (rest[-limit:] if limit else [])}
    return out


Sizes = Mapping[Key, int]
"""Per instance with live pods: how many pods it runs (pods_per_instance)."""


def running(history: History, pods: list[dict]) -> dict[Key, dict]:
    """Per instance whose live pods run one revision with a record: that record (the StatefulSet and
    config its pods run). Read once per reconcile and passed to pods_per_instance and gate.own_prefixes."""
    out: dict[Key, dict] = {}
    for inst, members in by_instance(pods).items():
        revisions = {label(p, REVISION) for p in members}
        for rec in history.get(inst, []) if len(revisions) == 1 else []:
            if label(rec, RECORDED_REVISION) in revisions:
                out[inst] = rec
    return out


def pods_per_instance(runs: Mapping[Key, dict]) -> dict[Key, int]:
    """Per instance whose live pods run one revision with a record (running): that record's
    StatefulSet `replicas`. An instance not moved yet through a change of pods per instance (decode
    DP2 -> DP4 on one node each) is whole with its own revision's count, not the spec's (expected_pods)."""
    return {inst: int(rec["data"]["statefulSet"]["spec"]["replicas"]) for inst, rec in runs.items()}


def expected_pods(resolved: Resolved, sizes: Sizes | None, role: str, index: int) -> int:
    """The pods instance `index` of `role` runs when whole: as its revision's record says
    (pods_per_instance), else as the spec's shape has it."""
    return (sizes or {}).get((role, index), resolved.shapes[role].pods)

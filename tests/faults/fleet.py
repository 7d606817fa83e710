"""A fleet of small PDDeployments for the fault scenarios, and what converged means for it: every
live deployment has exactly the children its spec renders, each owned by it alone, and no child
is left of a deleted one."""

from __future__ import annotations

import copy

from operator_env import API, DEPLOYMENT_LABEL, children, example

from pd_operator.devcluster import DevCluster
from pd_operator.render import render
from pd_operator.validate import validate

NS = "default"


def fleet_doc(i: int, decode_replicas: int = 1) -> dict:
    doc = copy.deepcopy(example())
    doc["metadata"]["name"] = f"pdd-{i:03d}"
    doc["spec"]["decode"]["replicas"] = decode_replicas
    return doc


def expected_children(doc: dict) -> set[str]:
    return {f"{m['kind']}/{m['metadata']['name']}" for m in render(validate(doc))}


def live_deployments(cluster: DevCluster) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in cluster.list(API, "PDDeployment", NS)}


def problems(cluster: DevCluster, docs: dict[str, dict], foreign: set[str] = frozenset()) -> list[str]:
    """What still differs from convergence; `docs` holds the current spec of each live deployment by
    name, `foreign` the `Kind/name` of objects with our labels that other owners hold."""
    out = []
    live = live_deployments(cluster)
    found = children(cluster, NS)
    by_owner: dict[str, set[str]] = {}
    for ref, obj in found.items():
        if ref in foreign:
            continue
        owner = obj["metadata"]["labels"][DEPLOYMENT_LABEL]
        refs = obj["metadata"].get("ownerReferences") or []
        if owner not in live:
            out.append(f"orphan {ref} of deleted {owner}")
        elif [r["uid"] for r in refs] != [live[owner]["metadata"]["uid"]]:
            out.append(f"{ref} owner references {refs}")
        by_owner.setdefault(owner, set()).add(ref)
    for name, doc in docs.items():
        missing = expected_children(doc) - by_owner.get(name, set())
        extra = by_owner.get(name, set()) - expected_children(doc)
        out += [f"{name}: missing {sorted(missing)}"] if missing else []
        out += [f"{name}: unexpected {sorted(extra)}"] if extra else []
    return out

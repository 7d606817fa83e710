"""Which resource types the emulated API serves, described in kmock's own ``ResourcesArray`` terms.

kmock ships a discovery dump of a real K3s cluster (``ResourcesArray.load_bundled()``); we reuse it
for kinds, verbs, short names and subresources instead of re-typing them, but only keep the
group/versions/plurals below: the operator uses these, and serving every bundled kind (metrics,
gateway, ...) would advertise APIs that have no behaviour behind them.
CRDs are converted from their manifests by :func:`crd_resources`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import attrs
import kmock

SERVED_SUBRESOURCES = {"status"}
BUILTINS: dict[str, set[str]] = {
    "v1": {
        "pods",
        "services",
        "configmaps",
        "secrets",
        "events",
        "namespaces",
        "serviceaccounts",
        "endpoints",
        "persistentvolumeclaims",
        "nodes",
    },
    "apps/v1": {"deployments", "statefulsets", "replicasets", "controllerrevisions"},
    "networking.k8s.io/v1": {"networkpolicies"},
    "policy/v1": {"poddisruptionbudgets"},
    "coordination.k8s.io/v1": {"leases"},
    "events.k8s.io/v1": {"events"},
    "admissionregistration.k8s.io/v1": {"validatingwebhookconfigurations", "mutatingwebhookconfigurations"},
    "apiextensions.k8s.io/v1": {"customresourcedefinitions"},
}


def builtin_resources() -> kmock.ResourcesArray:
    """A fresh (mutable) registry of the built-in kinds; CRDs get added to it at runtime."""
    result = kmock.ResourcesArray()
    for res, info in _bundled_builtins().items():
        result[res] = attrs.evolve(info, subresources=set(info.subresources))
    return result


@functools.cache
def _bundled_builtins() -> dict[kmock.resource, kmock.ResourceInfo]:
    bundled = kmock.ResourcesArray()
    with warnings.catch_warnings():  # kmock 0.8 uses the deprecated importlib.resources.read_binary
        warnings.simplefilter("ignore", DeprecationWarning)
        bundled.load_bundled()
    result = {}
    for res in bundled:
        # `or ""` is for the type only: neither None nor "" is a BUILTINS key
        group_version = f"{res.group}/{res.version}" if res.group else (res.version or "")
        if res.plural in BUILTINS.get(group_version, ()):
            info = bundled[res]
            info.subresources &= SERVED_SUBRESOURCES  # advertise only what is actually served
            result[res] = info
    missing = sum(len(plurals) for plurals in BUILTINS.values()) - len(result)
    if missing:  # the bundled dump changed under us; fail loudly rather than serve less
        raise RuntimeError(f"{missing} built-in resources are absent from kmock's bundled discovery data")
    return result


def crd_resources(crd: dict[str, Any]) -> dict[kmock.resource, kmock.ResourceInfo]:
    """One discovery entry per served version of a CustomResourceDefinition manifest."""
    spec = crd["spec"]
    names = spec["names"]
    result = {}
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        subresources = set((version.get("subresources") or {}).keys())
        result[kmock.resource(spec["group"], version["name"], names["plural"])] = kmock.ResourceInfo(
            kind=names["kind"],
            singular=names.get("singular") or names["kind"].lower(),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            shortnames=names.get("shortNames", []),
            categories=names.get("categories", []),
            subresources=subresources,
            verbs=["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        )
    return result

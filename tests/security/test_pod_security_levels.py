"""Which Pod Security Standards level each rendered pod meets, judged by the real kube-apiserver's
Pod Security admission (v1.36.3): every pod template is created with a server-side dry run in
namespaces that enforce `restricted` and `baseline`. What docs/security.md states per pod:

- the proxy pod: restricted;
- an engine pod with host mounts (any node generation but `none`, or weights from a hostPath):
  privileged only (baseline forbids hostPath volumes; its containers meet restricted otherwise);
- an engine pod without host mounts: baseline as the image's user (root), restricted with
  spec.image.runAs.

Nothing here runs on an NPU node (the pods are judged, not started)."""

from __future__ import annotations

import pytest

from pd_operator.render import render
from pd_operator.render.runnable import validate
from support.cluster import ApiError, namespace_name
from support.rendered_pods import pod_specs
from support.specs import example

pytestmark = [pytest.mark.security, pytest.mark.integration]

LEVELS = ("restricted", "baseline")


@pytest.fixture(scope="module")
def enforcing(control_plane):
    """level -> a namespace enforcing it."""
    out = {level: namespace_name(f"pss-{level}") for level in LEVELS}
    for level, ns in out.items():
        control_plane.create_namespace(ns, {"pod-security.kubernetes.io/enforce": level,
                                            "pod-security.kubernetes.io/enforce-version": "v1.36"})
    yield out
    for ns in out.values():
        control_plane.delete_namespace(ns)


def admitted(cp, namespace: str, name: str, pod_spec: dict) -> str:
    """'' when the API server would create the pod, else its refusal."""
    if account := pod_spec.get("serviceAccountName"):
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts"
        if not cp.exists(f"{path}/{account}"):
            cp.api("POST", path, {"apiVersion": "v1", "kind": "ServiceAccount",
                                  "metadata": {"name": account}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}
    try:
        cp.api("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", pod)
    except ApiError as err:
        return err.body
    return ""


def levels_met(cp, enforcing: dict, doc: dict) -> dict[str, set[str]]:
    """workload name -> the levels whose enforcement admits its pods."""
    validation = validate(doc)
    assert validation.ok, [f.line() for f in validation.errors]
    out: dict[str, set[str]] = {}
    for name, spec in pod_specs(render(validation.resolved)):
        refusals = {level: admitted(cp, ns, name, spec) for level, ns in enforcing.items()}
        for why in refusals.values():
            assert not why or "violates PodSecurity" in why, why  # refused for its security, nothing else
        out[name] = {level for level, why in refusals.items() if not why} | {"privileged"}
    return out


def engine_without_host_mounts(**image: object) -> dict:
    doc = example()  # weights from a PVC
    for role in ("prefill", "decode"):
        doc["spec"][role]["hostMounts"] = {"generation": "none"}
    doc["spec"]["image"] |= image
    return doc


def test_the_examples_pods_meet_the_levels_the_docs_state(control_plane, enforcing):
    met = levels_met(control_plane, enforcing, example())
    proxy = [n for n in met if n.endswith("-proxy")]
    assert proxy and all(met[n] == {"restricted", "baseline", "privileged"} for n in proxy), met
    engines = [n for n in met if n not in proxy]
    assert engines and all(met[n] == {"privileged"} for n in engines), met  # the driver's host mounts


def test_engine_pods_without_host_mounts_meet_baseline_and_restricted_as_non_root(control_plane, enforcing):
    as_root = levels_met(control_plane, enforcing, engine_without_host_mounts())
    engines = [n for n in as_root if not n.endswith("-proxy")]
    assert all(as_root[n] == {"baseline", "privileged"} for n in engines), as_root
    hwhiai = {"uid": 1000, "gid": 1000}
    non_root = levels_met(control_plane, enforcing, engine_without_host_mounts(runAs=hwhiai))
    assert all(non_root[n] == {"restricted", "baseline", "privileged"} for n in engines), non_root

"""`kubectl scale` of each role through its PDRole on the real control plane (issue 18 items 1, 2).

docs/scaling.md's `kubectl scale` lines for the GLM example run verbatim (a kubeconfig whose context
namespace is the test's), the StatefulSets follow, the PDRole and PDDeployment report desired and
ready instances, and the operator never writes a scaler's count back: the audit log shows no write
of a PDRole's spec by the operator apart from creating it and forwarding a changed spec, and
reconciles of the settled object write nothing. A scale beyond a ratio bound is held, with the
condition. Only conditions are waited for (generous deadlines); nothing asserts a duration.
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import shutil
import urllib.parse

import pytest
import yaml

from pd_operator.api.labels import FORWARDED_REPLICAS, KV_LAYOUT
from pd_operator.api.types import GROUP, VERSION
from support.cluster import ControlPlane, wait_for
from support.installed import condition, get_pdd, weights_claim
from support.kube import kubectl
from support.specs import ROOT, example

pytestmark = [pytest.mark.integration, pytest.mark.scaling]

GLM = "glm-flash"
TIMEOUT_S = 180
DOC_SCALES = [line for line in (ROOT / "docs" / "scaling.md").read_text().splitlines()
              if line.startswith("kubectl scale")]


def _pdrole(cp: ControlPlane, namespace: str, role: str) -> dict:
    return dict(cp.api("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/pdroles/{GLM}-{role}"))


def _sets(cp: ControlPlane, namespace: str, role: str) -> list[str]:
    selector = urllib.parse.quote(f"pd.serving.dev/deployment={GLM},pd.serving.dev/role={role}")
    path = f"/apis/apps/v1/namespaces/{namespace}/statefulsets?labelSelector={selector}"
    items = cp.api("GET", path)["items"]
    return sorted(s["metadata"]["name"] for s in items if not s["metadata"].get("deletionTimestamp"))


def _wait(cp: ControlPlane, namespace: str, what: str, check) -> None:  # type: ignore[no-untyped-def]
    try:
        wait_for(what, check, TIMEOUT_S, interval=0.3)
    except TimeoutError:
        status = get_pdd(cp, namespace, GLM).get("status", {})
        roles = {r: _pdrole(cp, namespace, r) for r in ("prefill", "decode")}
        raise AssertionError(f"{what}: not reached.\nPDDeployment status: {json.dumps(status, indent=1)}\n"
                             f"PDRoles: {json.dumps(roles, indent=1)}") from None


def _cond(cp: ControlPlane, namespace: str, kind: str) -> tuple[str, str]:
    found = condition(get_pdd(cp, namespace, GLM), kind)
    return found.get("status", ""), found.get("reason", "")


def _counts(role_status: dict) -> dict:
    """A role's status without its per-instance list and revision (tests/scaling/test_rollout_*)."""
    return {k: v for k, v in role_status.items() if k not in ("instances", "revision")}


def _get_pdr(kubeconfig: pathlib.Path) -> dict[str, list[str]]:
    """`kubectl get pdr` as a user reads it: NAME -> the other columns."""
    lines = kubectl(kubeconfig, "get", "pdr").stdout.strip().splitlines()
    header = lines[0].split()
    assert header == ["NAME", "DEPLOYMENT", "ROLE", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "DRAINING",
                      "AGE"], header
    return {row.split()[0]: row.split()[1:6] for row in lines[1:]}


def _operator_role_writes(cp: ControlPlane, since: int, user: str, namespace: str) -> list[str]:
    """The operator's writes of PDRoles themselves (spec, metadata), not their status."""
    return [str(e) for e in cp.audit.events(since, user=user, namespace=namespace, resource="pdroles")
            if e.write]


def _settled_writes(cp: ControlPlane, op, user: str, namespace: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Every write by the operator once settled, a finished drain included: the drain's last status
    write comes after its prune, in a reconcile the test cannot see end."""
    _wait(cp, namespace, "no instance draining",
          lambda: "draining" not in get_pdd(cp, namespace, GLM).get("status", {}))
    return op.writes_when_settled(cp, user, namespace)


def test_scaling_doc_has_one_scale_line_per_role():
    assert [re.sub(r"--replicas=\d+", "", line).split() for line in DOC_SCALES] == [
        ["kubectl", "scale", "pdrole", f"{GLM}-decode"], ["kubectl", "scale", "pdrole", f"{GLM}-prefill"]]


def test_kubectl_scale_moves_each_role_and_the_operator_never_fights_it(
        control_plane, namespace, release, start_operator, tmp_path):
    cp = control_plane
    op = start_operator("--drift-interval=2")
    user = release.user
    # docs/scaling.md's lines as they are: the kubeconfig's context names the namespace.
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(cp.kubeconfig, kubeconfig)
    kubectl(kubeconfig, "config", "set-context", "--current", f"--namespace={namespace}")

    doc = example(namespace=namespace)
    cp.create_weights_volume(namespace, weights_claim(doc))
    kubectl(kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc))
    _wait(cp, namespace, "GLM serving", lambda: _cond(cp, namespace, "Ready") == ("True", "Serving"))
    for role in ("prefill", "decode"):
        pdrole = _pdrole(cp, namespace, role)
        (owner,) = pdrole["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("PDDeployment", GLM, True)
        assert pdrole["spec"] == {"deployment": GLM, "role": role, "replicas": 1}
        assert pdrole["metadata"]["annotations"][FORWARDED_REPLICAS] == "1"
    _wait(cp, namespace, "PDRole statuses", lambda: _get_pdr(kubeconfig) == {
        f"{GLM}-prefill": [GLM, "prefill", "1", "1", "1"], f"{GLM}-decode": [GLM, "decode", "1", "1", "1"]})

    mark = cp.audit.mark()
    for line in DOC_SCALES:
        kubectl(kubeconfig, *shlex.split(line)[1:])
    for role in ("prefill", "decode"):
        _wait(cp, namespace, f"two {role} StatefulSets",
              lambda role=role: _sets(cp, namespace, role) == [f"{GLM}-{role}-0", f"{GLM}-{role}-1"])
    _wait(cp, namespace, "2 ready instances per role", lambda: all(
        get_pdd(cp, namespace, GLM).get("status", {}).get(role, {}).get("readyInstances") == 2
        for role in ("prefill", "decode")) and _cond(cp, namespace, "Ready") == ("True", "Serving"))
    status = get_pdd(cp, namespace, GLM)["status"]
    assert _counts(status["decode"]) == {"desiredInstances": 2, "readyInstances": 2, "updatedInstances": 2,
                                         "shape": "2xDP2xTP4"}
    assert _counts(status["prefill"]) == {"desiredInstances": 2, "readyInstances": 2, "updatedInstances": 2,
                                          "shape": "2xTP8"}
    _wait(cp, namespace, "kubectl get pdr at 2", lambda: _get_pdr(kubeconfig) == {
        f"{GLM}-prefill": [GLM, "prefill", "2", "2", "2"], f"{GLM}-decode": [GLM, "decode", "2", "2", "2"]})
    # What an HPA reads: the scale subresource, with the leader selector.
    scale = cp.api("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/pdroles/{GLM}-decode/scale")
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (2, 2)
    assert scale["status"]["selector"] == (f"pd.serving.dev/deployment={GLM},pd.serving.dev/role=decode,"
                                           "apps.kubernetes.io/pod-index=0")
    # The scale came from kubectl; the operator wrote no PDRole (only their status), and nothing more
    # once settled.
    scale_writes = [e for e in cp.audit.events(mark, namespace=namespace, resource="pdroles/scale")
                    if e.write]
    assert len(scale_writes) == 2 and all(e.user == "admin" and e.code == 200 for e in scale_writes)
    assert _operator_role_writes(cp, mark, user, namespace) == []
    assert _settled_writes(cp, op, user, namespace) == []
    # A PDRole the operator must apply again (a hand edit of its label) keeps the scaler's count: the
    # operator's server-side apply does not carry spec.replicas, so it neither sets nor removes it.
    layout = _pdrole(cp, namespace, "decode")["metadata"]["labels"][KV_LAYOUT]
    kubectl(kubeconfig, "label", "pdr", f"{GLM}-decode", f"{KV_LAYOUT}=edited", "--overwrite")
    _wait(cp, namespace, "the label applied back",
          lambda: _pdrole(cp, namespace, "decode")["metadata"]["labels"][KV_LAYOUT] == layout)
    assert _pdrole(cp, namespace, "decode")["spec"]["replicas"] == 2
    (reapplied,) = _operator_role_writes(cp, mark, user, namespace)
    assert "patch" in reapplied and f"{GLM}-decode" in reapplied

    # Ratio bound: at most 1 decode per prefill. A scale of decode to 3 is held at 2, and says so.
    kubectl(kubeconfig, "patch", "pdd", GLM, "--type=merge",
            "-p", json.dumps({"spec": {"scaling": {"ratio": {"minPrefillPerDecode": 1}}}}))
    _wait(cp, namespace, "within bounds at 2:2",
          lambda: _cond(cp, namespace, "ScalingLimited") == ("False", "WithinBounds"))
    kubectl(kubeconfig, "scale", "pdrole", f"{GLM}-decode", "--replicas=3")
    _wait(cp, namespace, "decode held", lambda: _cond(cp, namespace, "ScalingLimited")
          == ("True", "MinPrefillPerDecode"))
    message = condition(get_pdd(cp, namespace, GLM), "ScalingLimited")["message"]
    assert f"PDRole {GLM}-decode" in message and "asks for 3 instances and runs 2" in message
    assert "spec.scaling.ratio.minPrefillPerDecode" in message
    # Written in the reconcile that would have added the instance: none was added.
    assert _sets(cp, namespace, "decode") == [f"{GLM}-decode-0", f"{GLM}-decode-1"]
    _wait(cp, namespace, "the PDRole showing the hold", lambda: _get_pdr(kubeconfig)[f"{GLM}-decode"]
          == [GLM, "decode", "3", "2", "2"])
    decode = _pdrole(cp, namespace, "decode")
    (held,) = decode["status"]["conditions"]
    assert (held["type"], held["status"], held["reason"]) == ("ScalingLimited", "True", "MinPrefillPerDecode")
    # Held, not reverted: the request stays the scaler's, and settled reconciles write nothing.
    assert _settled_writes(cp, op, user, namespace) == []
    assert _pdrole(cp, namespace, "decode")["spec"]["replicas"] == 3

    # A change of the PDDeployment's own count is forwarded once...
    mark = cp.audit.mark()
    kubectl(kubeconfig, "patch", "pdd", GLM, "--type=merge",
            "-p", json.dumps({"spec": {"decode": {"replicas": 2}}}))
    _wait(cp, namespace, "the decode count forwarded",
          lambda: _pdrole(cp, namespace, "decode")["spec"]["replicas"] == 2)
    assert _pdrole(cp, namespace, "decode")["metadata"]["annotations"][FORWARDED_REPLICAS] == "2"
    _wait(cp, namespace, "within bounds again",
          lambda: _cond(cp, namespace, "ScalingLimited") == ("False", "WithinBounds"))
    (forward,) = _operator_role_writes(cp, mark, user, namespace)
    assert "patch" in forward
    # ... and a later scale still wins: the operator does not forward the unchanged spec again.
    kubectl(kubeconfig, "scale", "pdrole", f"{GLM}-decode", "--replicas=1")
    _wait(cp, namespace, "one decode StatefulSet",
          lambda: _sets(cp, namespace, "decode") == [f"{GLM}-decode-0"])
    _wait(cp, namespace, "decode at 1 ready", lambda: _counts(get_pdd(cp, namespace, GLM)["status"]["decode"])
          == {"desiredInstances": 1, "readyInstances": 1, "updatedInstances": 1, "shape": "1xDP2xTP4"})
    assert _settled_writes(cp, op, user, namespace) == []
    assert _pdrole(cp, namespace, "decode")["spec"]["replicas"] == 1
    assert _operator_role_writes(cp, mark, user, namespace) == [forward]

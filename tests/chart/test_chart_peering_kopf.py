"""The chart's peering wiring on the real control plane: `helm install` with two replicas renders
`--peering` and the peering object; two operators started with the chart's arguments, each as the
chart's ServiceAccount with its own POD_ID (the chart sets it from the pod name), keep their
records alive in that object, which the chart's RBAC lets them patch."""

from __future__ import annotations

import pathlib

import pytest

from support.cluster import ControlPlane, namespace_name, wait_for
from support.installed import Release, helm_install, helm_uninstall

pytestmark = pytest.mark.integration

PEERS = ("pdo-pd-operator-7d9f8-x2x4q", "pdo-pd-operator-7d9f8-b5n2m")


def _peering_path(release: Release, kind: str) -> str:
    (peering,) = release.find(kind)
    meta = peering["metadata"]
    if kind == "KopfPeering":
        return f"/apis/kopf.dev/v1/namespaces/{meta['namespace']}/kopfpeerings/{meta['name']}"
    return f"/apis/kopf.dev/v1/clusterkopfpeerings/{meta['name']}"


@pytest.mark.parametrize(("namespaced", "kind"), [(False, "ClusterKopfPeering"), (True, "KopfPeering")])
def test_operators_keep_their_records_in_the_chart_peering_object(control_plane: ControlPlane, namespace: str,
                                                                  tmp_path: pathlib.Path, namespaced, kind):
    cp = control_plane
    home = namespace_name("pdo")
    values = ["replicaCount=2", "webhook.enabled=false", *([f"watchNamespaces={{{namespace}}}"] * namespaced)]
    mark = cp.audit.mark()
    release = helm_install(cp, tmp_path, release="pdo", namespace=home, values=values)
    try:
        assert any(a.startswith("--peering=") for a in release.container["args"])
        path = _peering_path(release, kind)
        operators = []
        for peer in PEERS:
            workdir = tmp_path / peer
            workdir.mkdir()
            op = release.operator(cp, workdir, env={"POD_ID": peer})
            op.start()
            operators.append(op)
        try:
            def records() -> dict:
                status = cp.api("GET", path).get("status") or {}
                return status if set(PEERS) <= set(status) else {}
            found = wait_for("both peers in the peering object", records, 60)
        finally:
            for op in operators:
                op.stop()
        priorities = [found[peer]["priority"] for peer in PEERS]
        assert len(set(priorities)) == 2, found  # equal priorities would pause both
        assert not cp.audit.forbidden(mark, user=release.user)
    finally:
        helm_uninstall(cp, release)
        cp.delete_namespace(home)

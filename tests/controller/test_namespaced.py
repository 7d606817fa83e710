"""Namespaced mode on the real control plane: `helm install --set watchNamespaces={ns}` grants the
operator a Role in that namespace only, and its webhook judges only that namespace."""

from __future__ import annotations

import pytest
import yaml

from support.cluster import namespace_name, wait_for
from support.installed import condition, get_pdd, helm_install, helm_uninstall, is_ready
from support.kube import kubectl
from support.specs import example

pytestmark = pytest.mark.integration


def test_operator_serves_only_its_namespaces(control_plane, namespace, tmp_path):
    cp = control_plane
    other, home = namespace_name("not-served"), namespace_name("pd-operator")
    cp.create_namespace(other)
    mark = cp.audit.mark()
    release = helm_install(cp, tmp_path, release="pd-ns", namespace=home,
                           values=[f"watchNamespaces={{{namespace}}}"])
    try:
        assert {r["metadata"]["namespace"] for r in release.find("Role")} == {namespace}
        with release.operator(cp, tmp_path) as op:
            op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "its webhook configured")
            docs = {}
            for ns in (namespace, other):
                docs[ns] = doc = example()
                doc["metadata"]["namespace"] = ns
                cp.create_weights_volume(ns, doc["spec"]["model"]["weights"]["pvc"]["claimName"])

            def applied() -> bool:  # once the API server calls the webhook at its new address
                result = kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(docs[namespace]),
                                 check=False)
                assert result.returncode == 0 or "failed calling webhook" in result.stderr, result.stderr
                return result.returncode == 0
            wait_for("the PDDeployment admitted", applied)
            kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(docs[other]))
            wait_for("Ready in the served namespace", lambda: is_ready(cp, namespace, "glm-flash"), 180)

            # The other namespace is neither reconciled nor judged by this operator.
            assert not get_pdd(cp, other, "glm-flash").get("status")
            assert cp.api("GET", f"/apis/apps/v1/namespaces/{other}/statefulsets")["items"] == []
            bad = example("incompatible-glm-tp8-tp3.yaml")
            for ns, refused in ((namespace, True), (other, False)):
                bad["metadata"]["namespace"] = ns
                result = kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
                assert (result.returncode != 0) == refused, (ns, result.stderr)
            assert condition(get_pdd(cp, namespace, "glm-flash"), "Ready")["status"] == "True"
        mine = cp.audit.events(mark, user=release.user)
        assert mine and not {e.namespace for e in mine} & {other}, sorted({str(e) for e in mine})[:20]
        assert not cp.audit.forbidden(mark, user=release.user)
    finally:
        helm_uninstall(cp, release)
        cp.delete_namespace(other)
        cp.delete_namespace(home)

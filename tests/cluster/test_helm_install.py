"""The operator installed as users install it, on the real control plane (tests/support).

`helm install` of charts/pd-operator; the operator runs with the chart's own arguments and only a
TokenRequest token of the chart's ServiceAccount, so the chart's RBAC is what the API server
enforces (and the audit log records). `kubectl apply` of every valid example reaches Ready=True
(the StatefulSet controller creates the pods, the scheduler binds them to NPU nodes, kwok runs
them); the incompatible example is refused by the API server calling the operator's webhook.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import yaml

from pd_operator.api.types import GROUP, PLURAL, VERSION
from pd_operator.controller.handlers import OWNED
from pd_operator.controller.webhook import WEBHOOK_NAME
from pd_operator.render.runnable import validate
from support.cluster import ControlPlane, wait_for
from support.installed import (
    Release,
    condition,
    example,
    get_pdd,
    helm_install,
    helm_uninstall,
    is_ready,
    weights_claim,
)
from support.kube import kubectl

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if "incompatible" not in p.name)
INCOMPATIBLE = sorted((ROOT / "examples").glob("*incompatible*.yaml"))
CRD = yaml.safe_load((ROOT / "crds" / f"{GROUP}_{PLURAL}.yaml").read_text())
READY_TIMEOUT_S = 300


@pytest.fixture
def release(control_plane: ControlPlane, tmp_path: pathlib.Path) -> Iterator[Release]:
    installed = helm_install(control_plane, tmp_path)
    yield installed
    # The self-signed configuration fails closed: left behind, it would refuse every later
    # PDDeployment write in this session's cluster.
    helm_uninstall(control_plane, installed)


def test_helm_install_serves_every_example(control_plane, namespace, release, tmp_path):
    cp = control_plane
    audit_start = cp.audit.mark()
    (config,) = release.find("ValidatingWebhookConfiguration")
    with release.operator(cp, tmp_path) as op:
        op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "the webhook configured")
        (hook,) = cp.api("GET", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
                                f"{config['metadata']['name']}")["webhooks"]
        assert hook["name"] == WEBHOOK_NAME and hook["clientConfig"]["url"].startswith("https://127.0.0.1:")
        # kopf's admission manager is not running: no mutating configuration was tried.
        assert not cp.audit.events(audit_start, user=release.user, resource="mutatingwebhookconfigurations")

        docs = [example(path, namespace) for path in EXAMPLES]
        for claim in sorted({c for d in docs if (c := weights_claim(d))}):
            cp.create_weights_volume(namespace, claim)
        admin = cp.kubeconfig
        applied = kubectl(admin, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
        assert all(f"{d['metadata']['name']} created" in applied.stdout for d in docs), applied.stdout

        def all_ready() -> bool:
            return all(is_ready(cp, namespace, d["metadata"]["name"]) for d in docs)

        try:
            wait_for("every example Ready=True", all_ready, READY_TIMEOUT_S, interval=1)
        except TimeoutError:
            states = {d["metadata"]["name"]: condition(get_pdd(cp, namespace, d["metadata"]["name"]), "Ready")
                      for d in docs}
            pods = kubectl(admin, "get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
            raise AssertionError(f"not Ready: {states}\n{pods}\n{op.output()[-4000:]}") from None

        # Pods exist because the StatefulSet controller made them, on kwok nodes, Ready.
        pods = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        assert pods and all(p["spec"].get("nodeName") for p in pods)
        assert all(condition(p, "Ready").get("status") == "True" for p in pods)

        # `kubectl get pdd` shows the CRD's printer columns (the wide ones with -o wide).
        table = kubectl(admin, "get", "pdd", "-n", namespace, "-o", "wide").stdout
        header = table.splitlines()[0].split()
        columns = [c["name"].upper() for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]]
        assert header == ["NAME", *columns], table
        for doc in docs:
            name = doc["metadata"]["name"]
            row = next(line.split() for line in table.splitlines() if line.startswith(f"{name} "))
            assert row[columns.index("READY") + 1] == "True", table

        for path in INCOMPATIBLE:
            bad = example(path, namespace)
            refused = kubectl(admin, "apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
            assert refused.returncode != 0, refused.stdout
            assert "denied the request" in refused.stderr, refused.stderr
            for finding in validate(bad).errors:
                assert finding.path in refused.stderr and finding.message in refused.stderr, refused.stderr
            path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{bad['metadata']['name']}"
            assert not cp.exists(path)

    # The chart's RBAC let the operator do everything it tried.
    mine = cp.audit.events(audit_start, user=release.user)
    assert any(e.verb == "patch" and e.resource == "statefulsets" for e in mine), "no audit of the operator"
    assert all(e.decision for e in mine)
    # It lists and watches only its own children and pods (by label): no tenant's ConfigMap reaches it.
    owned = {plural for _, _, plural in OWNED}
    reads = [e for e in mine if e.verb in ("list", "watch") and e.resource in owned]
    assert {e.resource for e in reads} >= {"configmaps", "pods", "statefulsets"}, reads
    uris = [str(e.raw.get("requestURI", "")) for e in reads]
    unfiltered = [uri for uri in uris if "labelSelector=" not in uri]
    assert not unfiltered, unfiltered
    forbidden = [str(e) for e in cp.audit.forbidden(audit_start, user=release.user)]
    assert not forbidden, forbidden

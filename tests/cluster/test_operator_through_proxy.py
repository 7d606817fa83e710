"""The fault proxy carries the real operator: kopf's watches stream through it, its writes are
counted, and a write hook kills the operator at its 4th write, mid-reconcile (an event, not a timer); a new
operator then finishes the job. The foundation the fault tier builds on."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import yaml

from support.cluster import ControlPlane, wait_for
from support.faultproxy import FaultProxy
from support.installed import Release, helm_install, helm_uninstall, is_ready, weights_claim
from support.kube import kubectl
from support.specs import example

pytestmark = pytest.mark.integration

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "glm-5.3-flash-tp8-dp2tp4.yaml"


@pytest.fixture
def release(control_plane: ControlPlane, tmp_path: pathlib.Path) -> Iterator[Release]:
    installed = helm_install(control_plane, tmp_path, release="pd-proxied")
    yield installed
    helm_uninstall(control_plane, installed)


def test_operator_killed_at_its_fourth_write_then_replaced(control_plane, namespace, release,
                                                           fault_proxy: FaultProxy, tmp_path):
    cp, proxy = control_plane, fault_proxy
    doc = example(EXAMPLE, namespace)
    name = doc["metadata"]["name"]
    cp.create_weights_volume(namespace, str(weights_claim(doc)))

    first = release.operator(cp, tmp_path, server=proxy.url)
    # The first reconcile applies 9 children, then the status: the 4th write is mid-way.
    killed = proxy.on_write(4, lambda write: first.kill(), namespace=namespace)
    with first:
        first.wait_health(lambda h: h.get("webhook", {}).get("ok") is True)
        # Reviews come from the API server, not through the proxy: the write is the apply itself.
        kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc))
        assert killed.wait(120), f"the operator made fewer than 4 writes:\n{first.output()[-3000:]}"
        assert not first.running()
    assert any(r.verb == "watch" and r.resource == "pddeployments" for r in proxy.requests)
    writes_before = len([w for w in proxy.writes if w.namespace == namespace])
    assert writes_before >= 4 and not is_ready(cp, namespace, name)

    with release.operator(cp, tmp_path, server=proxy.url) as second:
        wait_for("Ready after the restart", lambda: is_ready(cp, namespace, name), 300, interval=0.5)
        assert second.running()
    assert len([w for w in proxy.writes if w.namespace == namespace]) > writes_before
    assert not cp.audit.forbidden(user=release.user)

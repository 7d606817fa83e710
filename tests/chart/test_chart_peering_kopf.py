"""The chart's peering wiring works with real kopf: started with the flags the chart renders and the
POD_ID identity the chart sets, kopf finds the chart's peering CRDs and keeps its peer record alive
in the peering object the chart creates (on the emulated API server)."""

from __future__ import annotations

import textwrap
import time

import kubernetes
import pytest
from chart_render import find, operator_container, rendered
from kopf.testing import KopfRunner

from pd_operator.devcluster import DevCluster

pytestmark = pytest.mark.integration

HANDLERS = textwrap.dedent("""
    import kopf


    @kopf.on.login()
    def login(**kwargs):
        return kopf.login_via_client(**kwargs)


    @kopf.on.create("pd.serving.dev", "v1alpha1", "pddeployments")
    def noop(**_):
        pass
""")
POD_ID = "pdo-pd-operator-7d9f8-x2x4q"


def _kopf_flags(docs: list[dict]) -> list[str]:
    """The chart's flags that `pd-operator run` passes on to kopf itself."""
    args = operator_container(docs)["args"]
    return [a for a in args if a == "--all-namespaces" or a.startswith(("--namespace=", "--peering="))]


@pytest.mark.parametrize(("value_set", "kind"), [("peering", "ClusterKopfPeering"),
                                                 ("peering-namespaced", "KopfPeering")])
def test_kopf_keeps_its_record_in_the_chart_peering_object(value_set, kind, tmp_path, monkeypatch):
    docs = rendered(value_set)
    (peering,) = find(docs, kind)
    with DevCluster(namespaces=("default", "llm-prod")) as cluster:
        for crd in find(docs, "CustomResourceDefinition"):
            cluster.register_crd(crd)
        cluster.create(peering)
        # login_via_client() -> load_kube_config() reads the default path captured at import time.
        monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig_path)
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION",
                            cluster.kubeconfig_path)
        monkeypatch.setattr(kubernetes.client.Configuration, "_default", None)
        monkeypatch.setenv("POD_ID", POD_ID)
        handlers = tmp_path / "handlers.py"
        handlers.write_text(HANDLERS)

        meta = peering["metadata"]
        args = ["run", *_kopf_flags(docs), "--verbose", str(handlers)]
        with KopfRunner(args, timeout=30) as runner:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                record = cluster.get("kopf.dev/v1", kind, meta.get("namespace"), meta["name"])
                if POD_ID in (record or {}).get("status", {}):
                    break
                time.sleep(0.1)

    assert runner.exception is None and runner.exit_code == 0, runner.output[-3000:]
    assert POD_ID in record.get("status", {}), runner.output[-3000:]
    assert record["status"][POD_ID]["priority"] == 0

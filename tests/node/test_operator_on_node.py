"""The operator as `helm install` deploys it, from its image, on the real node: the kubelet runs the
chart's pod (read-only root, non-root, its probes), the operator reaches kube-apiserver at the
`kubernetes` Service's ClusterIP with its ServiceAccount's projected token (the in-cluster
configuration), and kube-apiserver calls its webhook at the pod's IP: the incompatible example is
refused with its findings, the GLM 1p1d example is admitted and its engine pods bound to the node.
"""

from __future__ import annotations

import pytest
import yaml

from pd_operator.render.runnable import validate
from support import containers
from support.cluster import namespace_name, wait_for
from support.installed import helm_install, helm_uninstall, wait_webhook_called, weights_claim
from support.kube import kubectl
from support.node import NodeCluster
from support.specs import EXAMPLES, example

pytestmark = pytest.mark.node

CHART_IMAGE = "ghcr.io/pd-serving/pd-operator:0.1.0"
"""The image the chart names by default (its appVersion), which the rendered pd-tools and proxy
containers name too: the operator image built by the images tier, imported under that name."""


def test_the_operator_from_its_image_runs_on_the_node_and_its_webhook_answers(node_cluster: NodeCluster,
                                                                                tmp_path):
    cluster = node_cluster
    cluster.node.import_podman_image(containers.build(*containers.OPERATOR), CHART_IMAGE)
    release = helm_install(cluster, tmp_path)
    try:
        def operator_ready() -> dict | None:
            pods = cluster.api("GET", f"/api/v1/namespaces/{release.namespace}/pods")["items"]
            return next((p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                                for c in p["status"].get("conditions", []))), None)

        pod = wait_for("the operator's pod Ready by its probe", operator_ready, timeout=240,
                       alive=cluster.node.components.values())
        assert pod["spec"]["nodeName"] == cluster.node.name
        assert pod["spec"]["containers"][0]["image"] == CHART_IMAGE
        assert any(c["labels"].get("io.kubernetes.pod.name") == pod["metadata"]["name"]
                   for c in cluster.node.containers())

        namespace = namespace_name("operator-on-node")
        cluster.create_namespace(namespace)
        wait_webhook_called(cluster, namespace, timeout=120)
        bad = example(EXAMPLES / "incompatible-glm-tp8-tp3.yaml", namespace)
        refused = kubectl(cluster.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
        assert refused.returncode != 0 and "denied the request" in refused.stderr, refused.stderr
        for finding in validate(bad).errors:
            assert finding.path in refused.stderr and finding.message in refused.stderr, refused.stderr

        good = example(EXAMPLES / "glm-5.3-flash-1p1d-tp4.yaml", namespace)
        claim = weights_claim(good)
        assert claim
        cluster.create_weights_volume(namespace, claim)  # bound, for the scheduler; never mounted here
        kubectl(cluster.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(good))

        def engines_bound() -> list[dict]:
            pods = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
            engines = [p for p in pods if p["metadata"].get("labels", {}).get("pd.serving.dev/role")
                       in ("prefill", "decode") and p["spec"].get("nodeName")]
            return engines if len(engines) == 2 else []

        for engine in wait_for("the example's engine pods bound", engines_bound, timeout=240):
            assert engine["spec"]["nodeName"] == cluster.node.name
    finally:
        helm_uninstall(cluster, release)

"""`make demo`: the whole loop on one machine, on a real Kubernetes control plane with a real node.

Prints the KV plan of a PDDeployment manifest (what `pdctl plan` shows), starts kube-apiserver, etcd,
controller-manager and scheduler with one real node (the kubelet, containerd, runc and the CNI bridge,
an NPU device-plugin stand-in: tests/support/node.py), imports the images tier's images into containerd
(the operator image as the chart's, the serving stand-in under the serving image names of the examples),
installs the chart with `helm install` (the operator runs from its image on the node), `kubectl apply`s
the manifest, and shows what a user would see: `kubectl get nodes -o wide`, `kubectl get pdd`, its
conditions, the children and pods, the pods' containers as containerd lists them, a completion answered
through pd-proxy, the KV bytes decode pulled from prefill over Mooncake and verified, and how long each
step took. Needs root (the node's namespaces, cgroups and bridge).

    PYTHONPATH=tests .venv/bin/python -m support.demo examples/glm-5.3-flash-tp8-dp2tp4.yaml
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import yaml

from pd_operator.api.labels import DEPLOYMENT
from pd_operator.kv.summary import report_table
from pd_operator.render.kinds import CHILD_KINDS
from pd_operator.render.runnable import validate
from support.cluster import kubernetes_version, wait_for
from support.installed import helm_uninstall
from support.kube import kubectl
from support.node import NodeCluster
from support.node_journey import apply_example, complete, import_images, install, remove, verified, wait_ready

PROMPT = "Where does the KV cache of this prompt go?"


def _show(title: str, text: str) -> None:
    print(f"\n== {title}\n{text.rstrip()}", flush=True)


CONDITIONS = ("{range .status.conditions[*]}{.type}{'\\t'}{.status}{'\\t'}{.reason}{'\\t'}{.message}"
              "{'\\n'}{end}")
OWNERS = "custom-columns=KIND:.kind,NAME:.metadata.name,OWNER:.metadata.ownerReferences[0].name"


class Steps:
    """Each step's wall time, printed as it ends and once more at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        yield
        self.seconds[name] = time.monotonic() - began
        print(f"   ({name}: {self.seconds[name]:.1f} s)", flush=True)

    def summary(self) -> str:
        return "\n".join(f"{name}: {seconds:.1f} s" for name, seconds in self.seconds.items())


def _show_result(cluster: NodeCluster, namespace: str, name: str) -> None:
    admin = cluster.kubeconfig
    _show(f"kubectl get pdd -n {namespace} -o wide",
          kubectl(admin, "get", "pdd", "-n", namespace, "-o", "wide").stdout)
    _show("conditions",
          kubectl(admin, "get", "pdd", name, "-n", namespace, "-o", f"jsonpath={CONDITIONS}").stdout)
    # PodGroups only exist with spec.scheduling.gang, and `kubectl get` fails on a kind not served.
    kinds = ",".join(sorted({plural for (_, kind), plural in CHILD_KINDS.items() if kind != "PodGroup"}))
    _show(f"children (kubectl get {kinds} -l {DEPLOYMENT}={name})",
          kubectl(admin, "get", kinds, "-n", namespace, "-l", f"{DEPLOYMENT}={name}", "-o", OWNERS).stdout)
    _show("pods (created by the StatefulSet and Deployment controllers, run by the kubelet)",
          kubectl(admin, "get", "pods", "-n", namespace, "-o", "wide").stdout)
    running = cluster.node.running_tasks()
    rows = []
    for c in cluster.node.containers():
        labels = c["labels"]
        if labels.get("io.kubernetes.pod.namespace") == namespace:
            state = "RUNNING" if c["id"] in running else "exited"
            rows.append(f"{labels.get('io.kubernetes.pod.name', ''):40} "
                        f"{labels.get('io.kubernetes.container.name', ''):16} {state:8} {c['image']}")
    _show(f"containerd on {cluster.node.name} (ctr -n k8s.io containers list and tasks list, this namespace)",
          "\n".join(sorted(rows)))


def demo(manifest_path: str, cluster: NodeCluster | None = None) -> int:
    """The demo on `cluster` (a running NodeCluster, left running), or on one of its own."""
    doc = yaml.safe_load(pathlib.Path(manifest_path).read_text())
    validation = validate(doc)
    print(f"== pdctl plan {manifest_path}")
    if validation.report is not None:
        print(report_table(validation.report))
    if not validation.ok:
        for finding in validation.errors:
            print(finding.line())
        return 1
    namespace = validation.deployment.namespace  # type: ignore[union-attr]
    steps = Steps()
    own = cluster is None
    if own:
        print(f"\n== starting kube-apiserver {kubernetes_version()}, etcd, kube-controller-manager, "
              "kube-scheduler, and a node: the kubelet, containerd, the NPU device plugin", flush=True)
        with steps("the control plane and the node"):
            cluster = NodeCluster().start()
    assert cluster is not None
    try:
        with tempfile.TemporaryDirectory(prefix="pd-demo-") as tmp:
            return _journey(cluster, manifest_path, namespace, pathlib.Path(tmp), steps)
    finally:
        if own:
            cluster.stop()


def _journey(cluster: NodeCluster, manifest_path: str, namespace: str, workdir: pathlib.Path,
             steps: Steps) -> int:
    admin = cluster.kubeconfig
    _show("kubectl get nodes -o wide", kubectl(admin, "get", "nodes", "-o", "wide").stdout)
    with steps("import the images into containerd"):
        names = import_images(cluster)
    _show("images imported into containerd (podman save, ctr images import)", "\n".join(names))
    with steps("helm install, the operator's pod Ready"):
        release = install(cluster, workdir)
    deployment = None
    try:
        _show(f"helm install {release.name} charts/pd-operator -n {release.namespace} --create-namespace",
              kubectl(admin, "get", "pods", "-n", release.namespace, "-o", "wide").stdout)
        with steps(f"kubectl apply -f {manifest_path}"):
            deployment = apply_example(cluster, pathlib.Path(manifest_path).resolve(), namespace)
        print(f"\n== kubectl apply -f {manifest_path} -n {namespace}   (after creating the Secret "
              f"{deployment.doc['spec']['proxy']['apiKey']['name']} and the weights claim)")
        with steps("the PDDeployment Ready"):
            wait_ready(cluster, deployment)
        _show_result(cluster, namespace, deployment.name)
        with steps("a completion through pd-proxy"):
            answer = complete(cluster, deployment, PROMPT)
        _show(f"POST /v1/completions through pd-proxy (prompt {PROMPT!r})",
              f"HTTP {answer.status}: {answer.body}")
        if answer.status != 200:
            return 1
        request_id = answer.request_id
        record = wait_for("decode's log of the verified KV",
                          lambda: verified(cluster, deployment, request_id), 60)
        _show(f"KV moved prefill -> decode over Mooncake (tcp), from {record['pod']}'s log",
              f"verified {record['bytes']} bytes in {record['entries']} runs from {record['from']} "
              f"(segment {record['segment']}, {record['ms']} ms), {record['promptTokens']} prompt tokens")
        _show("how long each step took", steps.summary())
        return 0 if record["ok"] else 1
    finally:
        if deployment is not None:
            remove(cluster, deployment)
        helm_uninstall(cluster, release)


def main(argv: Sequence[str] | None = None) -> int:
    top = argparse.ArgumentParser(prog="python -m support.demo", description=__doc__.splitlines()[0])
    top.add_argument("manifest", help="a PDDeployment manifest, e.g. examples/glm-5.3-flash-tp8-dp2tp4.yaml")
    args = top.parse_args(argv)
    return demo(args.manifest)


if __name__ == "__main__":
    sys.exit(main())

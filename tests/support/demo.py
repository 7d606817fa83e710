"""`make demo`: the whole loop on one machine against a real Kubernetes control plane.

Prints the KV plan of a PDDeployment manifest (what `pdctl plan` shows), starts kube-apiserver,
etcd, controller-manager, scheduler and kwok NPU nodes (tests/support/cluster.py), installs the
chart with `helm install`, runs the operator with the chart's arguments as the chart's
ServiceAccount, `kubectl apply`s the manifest, and shows with kubectl what a user would see: the
server version, `kubectl get pdd`, its conditions, the children the operator created and the
pods the StatefulSet controller made, Ready through kwok (no NPUs or containers here).

    PYTHONPATH=tests .venv/bin/python -m support.demo examples/glm-5.3-flash-tp8-dp2tp4.yaml
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
from collections.abc import Sequence

import yaml

from pd_operator.api.labels import DEPLOYMENT
from pd_operator.kv.summary import report_table
from pd_operator.render.kinds import CHILD_KINDS
from pd_operator.render.runnable import validate
from support.cluster import ControlPlane, kubernetes_version, wait_for
from support.installed import helm_install, is_ready, weights_claim
from support.kube import kubectl

READY_TIMEOUT_S = 300.0


def _show(title: str, text: str) -> None:
    print(f"\n== {title}\n{text.rstrip()}", flush=True)


CONDITIONS = ("{range .status.conditions[*]}{.type}{'\\t'}{.status}{'\\t'}{.reason}{'\\t'}{.message}"
              "{'\\n'}{end}")
OWNERS = "custom-columns=KIND:.kind,NAME:.metadata.name,OWNER:.metadata.ownerReferences[0].name"


def _prerequisites(cp: ControlPlane, doc: dict, namespace: str) -> None:
    """What the user creates before applying: the namespace and the weights volume the spec names."""
    if namespace != "default":
        cp.create_namespace(namespace)
    if claim := weights_claim(doc):
        cp.create_weights_volume(namespace, claim)
        print(f"\n== created PersistentVolumeClaim {namespace}/{claim} (the model weights the spec names)")


def _show_result(cp: ControlPlane, namespace: str, name: str) -> None:
    admin = cp.kubeconfig
    _show(f"kubectl get pdd -n {namespace} -o wide",
          kubectl(admin, "get", "pdd", "-n", namespace, "-o", "wide").stdout)
    _show("conditions",
          kubectl(admin, "get", "pdd", name, "-n", namespace, "-o", f"jsonpath={CONDITIONS}").stdout)
    # PodGroups only exist with spec.scheduling.gang, and `kubectl get` fails on a kind not served.
    kinds = ",".join(sorted({plural for (_, kind), plural in CHILD_KINDS.items() if kind != "PodGroup"}))
    _show(f"children (kubectl get {kinds} -l {DEPLOYMENT}={name})",
          kubectl(admin, "get", kinds, "-n", namespace, "-l", f"{DEPLOYMENT}={name}", "-o", OWNERS).stdout)
    _show("pods (created by the StatefulSet and Deployment controllers, run by kwok)",
          kubectl(admin, "get", "pods", "-n", namespace, "-o", "wide").stdout)


def demo(manifest_path: str) -> int:
    doc = yaml.safe_load(pathlib.Path(manifest_path).read_text())
    validation = validate(doc)
    print(f"== pdctl plan {manifest_path}")
    if validation.report is not None:
        print(report_table(validation.report))
    if not validation.ok:
        for finding in validation.errors:
            print(finding.line())
        return 1
    namespace, name = validation.deployment.namespace, validation.deployment.name  # type: ignore[union-attr]
    print(f"\n== starting kube-apiserver {kubernetes_version()}, etcd, kube-controller-manager, "
          "kube-scheduler, kwok NPU nodes", flush=True)
    # The control plane keeps its own directory (component logs) when the demo fails.
    with ControlPlane() as cp, tempfile.TemporaryDirectory(prefix="pd-demo-") as tmp:
        workdir = pathlib.Path(tmp)
        print(f"   ready in {cp.start_seconds:.1f} s at {cp.server}")
        admin = cp.kubeconfig
        version = kubectl(admin, "version").stdout.splitlines()
        _show("kubectl version", "\n".join(line for line in version if line.startswith("Server Version")))
        _show("kubectl get nodes -L accelerator", kubectl(admin, "get", "nodes", "-L", "accelerator").stdout)
        release = helm_install(cp, workdir)
        kinds = ", ".join(sorted({d["kind"] for d in release.manifest}))
        _show(f"helm install {release.name} charts/pd-operator -n {release.namespace} --create-namespace",
              f"installed: {kinds}")
        with release.operator(cp, workdir) as op:
            health = op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "its webhook")
            args = " ".join(release.container["args"])
            _show(f"pd-operator {args}   (the chart's args, as {release.user}; "
                  "health, metrics and webhook on free local ports)",
                  f"webhook: {health['webhook']['message']}")
            _prerequisites(cp, doc, namespace)
            _show(f"kubectl apply -f {manifest_path}", kubectl(admin, "apply", "-f", manifest_path).stdout)
            wait_for(f"{namespace}/{name} Ready", lambda: is_ready(cp, namespace, name), READY_TIMEOUT_S,
                     interval=0.5)
            _show_result(cp, namespace, name)
            requests = cp.audit.events(user=release.user)
            print(f"\n== audit log: {len(requests)} requests by {release.user}, "
                  f"{sum(e.code == 403 for e in requests)} refused")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    top = argparse.ArgumentParser(prog="python -m support.demo", description=__doc__.splitlines()[0])
    top.add_argument("manifest", help="a PDDeployment manifest, e.g. examples/glm-5.3-flash-tp8-dp2tp4.yaml")
    args = top.parse_args(argv)
    return demo(args.manifest)


if __name__ == "__main__":
    sys.exit(main())

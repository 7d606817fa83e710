"""`make demo`: the whole loop on one machine, in well under a minute.

Prints the KV plan of a PDDeployment manifest, starts the emulated API server with the generated
CRD, runs the real operator against it, creates the manifest over HTTP as kubectl would,
simulates the pods becoming ready (there are no NPUs here), then prints what `kubectl get pdd`
would show (the CRD's printer columns), the conditions and the children the operator created.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import re
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import kubernetes
import yaml

from pd_operator.api.types import GROUP, KIND, PLURAL, VERSION
from pd_operator.controller.background import BackgroundOperator, local_options
from pd_operator.controller.client import CHILD_KINDS
from pd_operator.devcluster import DevCluster
from pd_operator.kv.summary import report_table
from pd_operator.render.labels import DEPLOYMENT
from pd_operator.validate import validate

CRD = pathlib.Path(__file__).resolve().parents[2] / "crds" / f"{GROUP}_{PLURAL}.yaml"
READY_TIMEOUT_S = 30.0
FILTER = re.compile(r'^(?P<list>[.\w]+)\[\?\(@\.(?P<key>\w+)=="(?P<value>[^"]*)"\)\]\.(?P<field>\w+)$')


def _path(obj: Any, dotted: str) -> Any:
    for part in dotted.strip(".").split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def column(obj: dict, json_path: str) -> str:
    """The printer-column value: `.a.b` or `.list[?(@.key=="v")].field`, the forms the CRD uses."""
    if match := FILTER.match(json_path):
        items = _path(obj, match["list"]) or []
        hits = [i.get(match["field"]) for i in items if i.get(match["key"]) == match["value"]]
        return str(hits[0]) if hits else ""
    value = _path(obj, json_path)
    return "" if value is None else str(value)


def _age(timestamp: str, now: datetime) -> str:
    created = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return f"{int((now - created).total_seconds())}s"


def get_table(crd: dict, objects: list[dict], now: datetime) -> str:
    """`kubectl get pdd -o wide` as text."""
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    rows = [["NAME", *(c["name"].upper() for c in columns)]]
    for obj in objects:
        cells = [obj["metadata"]["name"]]
        for c in columns:
            value = column(obj, c["jsonPath"])
            cells.append(_age(value, now) if c["type"] == "date" and value else value)
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def _ready_all_pods(cluster: DevCluster, namespace: str) -> None:
    for pod in cluster.list("v1", "Pod", namespace):
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            cluster.set_pod_ready(namespace, pod["metadata"]["name"], True)


def _wait_ready(cluster: DevCluster, namespace: str, name: str) -> dict:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        _ready_all_pods(cluster, namespace)
        obj = cluster.get(f"{GROUP}/{VERSION}", KIND, namespace, name) or {}
        if column(obj, '.status.conditions[?(@.type=="Ready")].status') == "True":
            return obj
        time.sleep(0.1)
    raise TimeoutError(f"{namespace}/{name} did not become Ready in {READY_TIMEOUT_S:.0f}s")


def _children(cluster: DevCluster, namespace: str, name: str) -> list[str]:
    out = []
    for (api_version, kind) in CHILD_KINDS:
        for obj in cluster.list(api_version, kind, namespace, f"{DEPLOYMENT}={name}"):
            owner = (obj["metadata"].get("ownerReferences") or [{}])[0]
            owned_by = f"{owner.get('kind')}/{owner.get('name')}"
            out.append(f"  {kind:<20} {obj['metadata']['name']:<28} owner {owned_by}")
    return out


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
    crd = yaml.safe_load(CRD.read_text())
    started = time.monotonic()
    with DevCluster(crd_paths=[str(CRD)], namespaces=(namespace,)) as cluster:
        cluster.run_workload_controllers(pod_ready=False)
        with BackgroundOperator(local_options(cluster.kubeconfig_path)):
            config = kubernetes.client.Configuration()
            kubernetes.config.load_kube_config(config_file=cluster.kubeconfig_path,
                                               client_configuration=config)
            with kubernetes.client.ApiClient(config) as api:
                kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, doc)
            print(f"\n== kubectl apply -f {manifest_path}: created; marking pods ready as kubelets would")
            obj = _wait_ready(cluster, namespace, name)
            print(f"\n== kubectl get pdd -o wide   (Ready after {time.monotonic() - started:.1f}s)")
            print(get_table(crd, [obj], datetime.now(UTC)))
            print("\n== conditions")
            for c in obj["status"]["conditions"]:
                print(f"  {c['type']:<13} {c['status']:<6} {c['reason']:<18} {c['message']}")
            print(f"\n== kvLayout {obj['status']['kvLayout']}   proxy {obj['status'].get('proxyEndpoint')}")
            print("\n== children (all owned by the PDDeployment, so deleting it deletes them)")
            print("\n".join(_children(cluster, namespace, name)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    top = argparse.ArgumentParser(prog="python -m pd_operator.demo", description=__doc__.splitlines()[0])
    top.add_argument("manifest", help="a PDDeployment manifest, e.g. examples/glm-5.3-flash-tp8-dp2tp4.yaml")
    args = top.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kopf").setLevel(logging.ERROR)  # "OS signals are ignored" in a thread is expected
    return demo(args.manifest)


if __name__ == "__main__":
    sys.exit(main())

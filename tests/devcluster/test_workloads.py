"""The emulated StatefulSet/Deployment controllers."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

pytestmark = pytest.mark.integration

TEMPLATE = {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c", "image": "img:1"}]}}


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def sts(replicas: int) -> dict:
    return {
        "metadata": {"name": "w"},
        "spec": {
            "replicas": replicas,
            "serviceName": "w",
            "selector": {"matchLabels": {"app": "w"}},
            "template": TEMPLATE,
        },
    }


def status_of(cluster, kind: str) -> dict:
    return (cluster.get("apps/v1", kind, "default", "w") or {}).get("status", {})


def pod_names(cluster) -> list[str]:
    return sorted(p["metadata"]["name"] for p in cluster.list("v1", "Pod", "default", label_selector="app=w"))


def test_statefulset_pods_and_status(cluster, apps):
    cluster.run_workload_controllers()
    apps.create_namespaced_stateful_set("default", sts(3))
    eventually(lambda: status_of(cluster, "StatefulSet").get("readyReplicas") == 3)
    assert pod_names(cluster) == ["w-0", "w-1", "w-2"]
    pod = cluster.get("v1", "Pod", "default", "w-1")
    assert pod["status"]["phase"] == "Running" and pod["status"]["podIP"].startswith("10.")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet" and pod["spec"]["subdomain"] == "w"
    status = apps.read_namespaced_stateful_set("w", "default").status
    assert status.observed_generation == 1 and status.current_revision == status.update_revision

    apps.patch_namespaced_stateful_set("w", "default", {"spec": {"replicas": 1}})
    eventually(lambda: pod_names(cluster) == ["w-0"])
    eventually(lambda: apps.read_namespaced_stateful_set("w", "default").status.replicas == 1)
    assert apps.read_namespaced_stateful_set("w", "default").status.observed_generation == 2

    cluster.delete("v1", "Pod", "default", "w-0")
    eventually(lambda: pod_names(cluster) == ["w-0"])  # recreated

    cluster.set_pod_ready("default", "w-0", False)
    eventually(lambda: apps.read_namespaced_stateful_set("w", "default").status.ready_replicas == 0)
    cluster.set_pod_ready("default", "w-0", True)
    eventually(lambda: apps.read_namespaced_stateful_set("w", "default").status.ready_replicas == 1)

    failed = cluster.fail_pod("default", "w-0")
    assert failed["status"]["containerStatuses"][0]["restartCount"] == 1
    eventually(lambda: apps.read_namespaced_stateful_set("w", "default").status.ready_replicas == 0)

    apps.delete_namespaced_stateful_set("w", "default")
    eventually(lambda: pod_names(cluster) == [])  # garbage-collected


def test_template_change_rolls_pods(cluster, apps):
    cluster.run_workload_controllers()
    apps.create_namespaced_stateful_set("default", sts(2))
    eventually(lambda: len(pod_names(cluster)) == 2)
    old = cluster.get("v1", "Pod", "default", "w-0")["metadata"]["uid"]
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "img:2"}]}}}}
    apps.patch_namespaced_stateful_set("w", "default", patch)
    eventually(
        lambda: (
            all(p["spec"]["containers"][0]["image"] == "img:2" for p in cluster.list("v1", "Pod", "default"))
            and len(pod_names(cluster)) == 2
        )
    )
    assert cluster.get("v1", "Pod", "default", "w-0")["metadata"]["uid"] != old


def test_deployment_pods_and_status_with_unready_pods(cluster, apps):
    cluster.run_workload_controllers(pod_ready=False)
    deploy = {
        "metadata": {"name": "w"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "w"}}, "template": TEMPLATE},
    }
    apps.create_namespaced_deployment("default", deploy)
    eventually(lambda: len(pod_names(cluster)) == 2)
    names = pod_names(cluster)
    assert all(n.startswith("w-") and n.rsplit("-", 1)[1] in ("0", "1") for n in names)
    eventually(lambda: status_of(cluster, "Deployment").get("replicas") == 2)
    status = apps.read_namespaced_deployment("w", "default").status
    assert not status.ready_replicas and status.updated_replicas == 2
    assert {c.type: c.status for c in status.conditions}["Available"] == "False"
    for name in names:
        cluster.set_pod_ready("default", name, True)
    eventually(
        lambda: (
            {c.type: c.status for c in apps.read_namespaced_deployment("w", "default").status.conditions}[
                "Available"
            ]
            == "True"
        )
    )
    assert apps.read_namespaced_deployment("w", "default").status.available_replicas == 2


def test_controllers_are_quiet_when_converged(cluster, apps):
    cluster.run_workload_controllers()
    apps.create_namespaced_stateful_set("default", sts(2))
    eventually(
        lambda: (
            apps.read_namespaced_stateful_set("w", "default").status is not None
            and apps.read_namespaced_stateful_set("w", "default").status.ready_replicas == 2
        )
    )
    rv = cluster.store.resource_version
    time.sleep(0.2)
    assert cluster.store.resource_version == rv


def test_a_squatted_pod_name_does_not_stop_the_controllers(cluster, apps):
    cluster.create(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w-0", "namespace": "default"}, "spec": {}}
    )
    cluster.run_workload_controllers()
    apps.create_namespaced_stateful_set("default", sts(1))
    deploy = {
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {**TEMPLATE, "metadata": {"labels": {"app": "d"}}},
        },
    }
    apps.create_namespaced_deployment("default", deploy)
    eventually(lambda: len(cluster.list("v1", "Pod", "default", label_selector="app=d")) == 1)

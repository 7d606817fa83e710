"""Scheduling facts checked with the real kube-scheduler: an instance that cannot be placed stays
Pending and the PDDeployment says why (the scheduler's own message), and the pods of a multi-node
instance take a node each."""

from __future__ import annotations

import contextlib
import secrets

import pytest

from pd_operator.api.labels import INSTANCE, ROLE
from support.cluster import ApiError, ControlPlane, NodePool, wait_for
from support.installed import get_pdd
from support.pdd_cluster import apply, cond, glm, pods, serve, wait_cond
from support.specs import example

pytestmark = pytest.mark.integration


def _role_message(cp: ControlPlane, namespace: str, kind: str, name: str = "glm-flash") -> str:
    found = next(c for c in get_pdd(cp, namespace, name)["status"]["conditions"] if c["type"] == kind)
    return str(found["message"])


def test_missing_weights_pvc_keeps_the_instance_pending_and_says_why(control_plane, namespace,
                                                                    start_operator):
    cp = control_plane
    start_operator()
    doc = glm(namespace)
    claim = doc["spec"]["model"]["weights"]["pvc"]["claimName"]
    cp.api("POST", f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/pddeployments", doc)
    wait_cond(cp, namespace, "PrefillReady", ("False", "Unschedulable"))
    assert f'persistentvolumeclaim "{claim}" not found' in _role_message(cp, namespace, "PrefillReady")
    assert cond(cp, namespace, "Ready") == ("False", "Unschedulable")
    assert all(not p["spec"].get("nodeName") for p in pods(cp, namespace, f"{ROLE} in (prefill,decode)"))

    cp.create_weights_volume(namespace, claim)  # what the example says to create first
    serve(cp, namespace)


def test_more_npus_than_a_node_has_keeps_the_instance_pending_and_says_why(control_plane, namespace,
                                                                          start_operator):
    cp = control_plane
    start_operator()
    doc = glm(namespace)
    doc["spec"]["decode"]["npusPerNode"] = 16  # DP2 x TP4 = 8 NPUs; ask for a node of 16
    doc["spec"]["decode"].update(tensorParallelSize=8, dataParallelSize=2)
    apply(cp, doc)
    wait_cond(cp, namespace, "DecodeReady", ("False", "Unschedulable"))
    message = _role_message(cp, namespace, "DecodeReady")
    assert "pod glm-flash-decode-0-0 cannot be scheduled" in message
    assert "Insufficient huawei.com/Ascend910" in message, message
    # Decode's scheduling failure can be reported before prefill's pod is Ready: wait for that.
    wait_cond(cp, namespace, "PrefillReady", ("True", "InstancesReady"))
    assert cond(cp, namespace, "Ready") == ("False", "Unschedulable")


@pytest.fixture
def a3_nodes(control_plane: ControlPlane):
    """`add(n)`: n more 16-NPU A3 nodes under a label of this test's own (deleted after)."""
    label = f"a3-{secrets.token_hex(3)}"
    made: list[str] = []

    def add(count: int) -> str:
        pool = NodePool(f"{label}-{len(made)}", count, "huawei.com/ascend-1980", 16, {"accelerator": label})
        for node in pool.nodes():
            control_plane.api("POST", "/api/v1/nodes", node)
            made.append(node["metadata"]["name"])
        return label

    yield add
    for name in made:
        with contextlib.suppress(ApiError):
            control_plane.api("DELETE", f"/api/v1/nodes/{name}")


def test_pods_of_a_multi_node_instance_take_a_node_each(control_plane, namespace, start_operator, a3_nodes):
    cp = control_plane
    start_operator()
    label = a3_nodes(1)  # one node with NPUs for both decode pods: they must still not share it
    doc = glm(namespace, example("deepseek-v3.2-multinode-decode.yaml"))
    doc["spec"]["decode"]["nodeSelector"] = {"accelerator": label}
    apply(cp, doc)
    name = doc["metadata"]["name"]
    wait_cond(cp, namespace, "DecodeReady", ("False", "Unschedulable"), name)
    assert "anti-affinity" in _role_message(cp, namespace, "DecodeReady", name)
    decode = pods(cp, namespace, f"{ROLE}=decode,{INSTANCE}=0")
    assert sorted(bool(p["spec"].get("nodeName")) for p in decode) == [False, True]

    a3_nodes(1)
    serve(cp, namespace, name)
    nodes = [p["spec"]["nodeName"] for p in pods(cp, namespace, f"{ROLE}=decode,{INSTANCE}=0")]
    assert len(nodes) == 2 and len(set(nodes)) == 2, nodes
    wait_for("decode Ready", lambda: cond(cp, namespace, "DecodeReady", name) == ("True", "InstancesReady"))

"""The README's journey on the real node: `helm install` deploys the operator from its image (the
kubelet runs the chart's pod: read-only root, non-root, its probes; it reaches kube-apiserver at the
`kubernetes` Service's ClusterIP with its projected token, and kube-apiserver calls its webhook at the
pod's IP), the README's example is applied unmodified, and its pods run in containerd from the images
it names: pd-tools, pd-image-report and pd-preflight as rendered, the stand-in `vllm`
(support/serving_standin.py) serving the OpenAI API, the kv-probe and KV-link gate sidecars, pd-proxy.
A completion through pd-proxy moves the request's KV from the prefill pod to the decode pod over
Mooncake (tcp), and the decode container logs the bytes it verified.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest
import yaml

from pd_operator.render.runnable import validate
from pd_operator.spec.ports import PROBE_PORT
from support.cluster import kubernetes_version, namespace_name, wait_for
from support.installed import Release, helm_uninstall, is_ready, wait_webhook_called
from support.kube import kubectl
from support.node import NodeCluster
from support.node_journey import (
    CHART_IMAGE,
    VERIFIED,
    Answer,
    Deployment,
    Load,
    apply_example,
    complete,
    import_images,
    install,
    pods,
    ready_pod,
    remove,
    verified,
    wait_ready,
)
from support.serving_standin import MAX_PROMPT_TOKENS
from support.specs import EXAMPLES, example

pytestmark = pytest.mark.node

README_EXAMPLE = EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml"
STEPS: dict[str, float] = {}
"""Each journey step's wall time, printed by the journey test."""


class Step:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.began = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        STEPS[self.name] = time.monotonic() - self.began


@pytest.fixture(scope="module")
def release(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    with Step("import the images into containerd"):
        import_images(node_cluster)
    with Step("helm install, the operator's pod Ready"):
        installed = install(node_cluster, tmp_path_factory.mktemp("release"))
    yield installed
    helm_uninstall(node_cluster, installed)


@pytest.fixture(scope="module")
def journey(node_cluster: NodeCluster, release: Release) -> Iterator[Deployment]:
    namespace = namespace_name("journey")
    with Step(f"kubectl apply -f {README_EXAMPLE.name}"):
        deployment = apply_example(node_cluster, README_EXAMPLE, namespace)
    try:
        with Step("the PDDeployment Ready"):
            wait_ready(node_cluster, deployment)
        yield deployment
    finally:
        remove(node_cluster, deployment)


@pytest.mark.timeout(1800)  # the release fixture imports the images into containerd first (minutes)
def test_the_operator_from_its_image_runs_on_the_node_and_its_webhook_refuses_a_bad_pairing(
        node_cluster: NodeCluster, release: Release):
    cluster = node_cluster
    pod = ready_pod(cluster, release.namespace)
    assert pod and pod["spec"]["nodeName"] == cluster.node.name
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


@pytest.mark.timeout(1800)  # its fixtures import the images into containerd first (minutes)
def test_the_readme_journey_serves_a_completion_with_kv_moved_between_pods(
        node_cluster: NodeCluster, journey: Deployment):
    cluster = node_cluster
    with Step("a completion through pd-proxy"):
        answer = complete(cluster, journey, "Where does the KV cache of this prompt go?")
    assert answer.status == 200, answer.body
    assert answer.body["choices"][0]["text"].split() == [f"t{i}" for i in range(8)]
    record = wait_for("decode's log of the verified KV",
                      lambda: verified(cluster, journey, answer.request_id), 60)
    assert record["ok"] and record["errors"] == []
    assert record["bytes"] == record["planBytes"] > 0
    assert record["from"] == f"{journey.namespace}.{journey.name}-prefill-0"

    wide = kubectl(cluster.kubeconfig, "get", "nodes", "-o", "wide").stdout
    nodes = cluster.api("GET", "/api/v1/nodes")["items"]
    assert [n["metadata"]["name"] for n in nodes] == [cluster.node.name]  # no kwok node
    assert "kwok" not in cluster.components  # and no kubelet emulator: the kubelet is the node's
    assert "containerd://2." in wide and kubernetes_version() in wide
    listed = {(c["labels"].get("io.kubernetes.pod.name"), c["labels"].get("io.kubernetes.container.name"))
              for c in cluster.node.containers()}
    journey_pods = pods(cluster, journey)
    roles = {p["metadata"]["labels"].get("pd.serving.dev/role") for p in journey_pods}
    assert roles == {"prefill", "decode", "proxy"}
    for pod in journey_pods:
        assert pod["spec"]["nodeName"] == cluster.node.name, pod["metadata"]["name"]
        for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
            assert (pod["metadata"]["name"], container["name"]) in listed, (pod["metadata"]["name"],
                                                                            container["name"])

    print(f"\n{wide}")
    print(f"completion: {answer.body['choices'][0]['text']!r}; KV verified by {record['pod']}: "
          f"{record['bytes']} bytes in {record['entries']} runs from {record['segment']}")
    for step, seconds in STEPS.items():
        print(f"{step}: {seconds:.1f} s")


# What only a kubelet shows, on the journey's deployment (each test leaves it Ready and serving).


def engine_pod(deployment: Deployment, role: str) -> str:
    return f"{deployment.name}-{role}-0-0"


def container_status(cluster: NodeCluster, deployment: Deployment, pod: str, container: str) -> dict:
    got = cluster.api("GET", f"/api/v1/namespaces/{deployment.namespace}/pods/{pod}")
    return next(c for c in got["status"].get("containerStatuses", []) if c["name"] == container)


def task(cluster: NodeCluster, deployment: Deployment, pod: str, container: str) -> tuple[str, int]:
    """(containerd id, pid) of the container's running task."""
    running = cluster.node.running_tasks()
    (cid,) = [c["id"] for c in cluster.node.containers() if c["id"] in running
              and c["labels"].get("io.kubernetes.pod.namespace") == deployment.namespace
              and c["labels"].get("io.kubernetes.pod.name") == pod
              and c["labels"].get("io.kubernetes.container.name") == container]
    tasks = cluster.node.ctr("tasks", "list").stdout.splitlines()
    line = next(line for line in tasks if line.startswith(cid))
    return cid, int(line.split()[1])


def answered(cluster: NodeCluster, deployment: Deployment, status: int, timeout: float = 120) -> Answer:
    """The first completion through pd-proxy answered with `status` (the proxy's membership follows the
    operator's ConfigMap within its watch: answers right after a change may still be the old ones)."""
    def attempt() -> Answer | None:
        answer = complete(cluster, deployment, f"expecting {status}")
        return answer if answer.status == status else None

    return wait_for(f"a completion answered {status}", attempt, timeout, interval=1)


def serves_again(cluster: NodeCluster, deployment: Deployment) -> dict:
    """Ready again, and a completion moves verified KV; decode's record of it."""
    wait_ready(cluster, deployment)
    request_id = answered(cluster, deployment, 200).request_id
    return wait_for("decode's log of the verified KV", lambda: verified(cluster, deployment, request_id), 60)


def test_a_killed_engine_container_is_restarted_by_the_kubelet_and_serves_again(node_cluster, journey):
    cluster, decode = node_cluster, engine_pod(journey, "decode")
    before = container_status(cluster, journey, decode, "vllm")["restartCount"]
    _, pid = task(cluster, journey, decode, "vllm")
    os.kill(pid, signal.SIGKILL)

    def restarted() -> dict | None:
        status = container_status(cluster, journey, decode, "vllm")
        return status if status["restartCount"] == before + 1 and status.get("ready") else None

    status = wait_for("the decode engine restarted and Ready", restarted, 240, interval=1)
    assert status["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    record = serves_again(cluster, journey)
    assert record["ok"] and record["bytes"] == record["planBytes"] > 0


def test_a_prefill_pod_deleted_with_its_grace_period_while_serving_is_replaced(node_cluster, journey):
    """The kubelet sends the engine SIGTERM and gives it the rendered grace period; the StatefulSet
    makes the pod again under its name, and decode pulls from the new one (another Mooncake segment)."""
    cluster, prefill = node_cluster, engine_pod(journey, "prefill")
    path = f"/api/v1/namespaces/{journey.namespace}/pods/{prefill}"
    old = cluster.api("GET", path)
    grace = old["spec"]["terminationGracePeriodSeconds"]
    with Load(cluster, journey) as load:
        wait_for("the load served", lambda: any(a.status == 200 for a in load.answers), 120)
        cluster.api("DELETE", path)
        deleting = cluster.find(path)
        assert deleting is None or deleting["metadata"]["deletionGracePeriodSeconds"] == grace
        uid = old["metadata"]["uid"]
        wait_for("the prefill pod replaced", lambda: (cluster.find(path) or {"metadata": {"uid": uid}})
                 ["metadata"]["uid"] != uid, 240, interval=1)
        wait_for("the old pod's containers gone from containerd", lambda: not any(
            c["labels"].get("io.kubernetes.pod.uid") == uid for c in cluster.node.containers()), 120,
            interval=1)
        record = serves_again(cluster, journey)
    assert record["ok"] and record["bytes"] == record["planBytes"] > 0
    print(f"prefill pod deleted (grace {grace} s) under load: {len(load.answers)} requests, "
          f"{len(load.failed())} failed while it was replaced")


def test_the_decode_gates_readiness_drives_the_proxys_membership(node_cluster, journey):
    """The prefill's kv-probe frozen (its process stopped by the cgroup freezer, `ctr tasks pause`): the
    decode's KV-link gate fails its rounds (two in a row), the kubelet's readiness probe takes the decode
    pod out of Ready, the operator takes the decode instance out of the proxy's membership and the proxy
    answers 503; thawed, the next round links it and completions move verified KV again."""
    cluster, prefill, decode = node_cluster, engine_pod(journey, "prefill"), engine_pod(journey, "decode")
    membership = f"/api/v1/namespaces/{journey.namespace}/configmaps/{journey.name}-proxy"
    probe, _ = task(cluster, journey, prefill, "kv-probe")
    cluster.node.ctr("tasks", "pause", probe)
    try:
        wait_for("the decode pod's kv-link not ready",
                 lambda: not container_status(cluster, journey, decode, "kv-link")["ready"], 180, interval=1)
        wait_for("the decode instance out of the proxy's membership", lambda: not json.loads(
            cluster.api("GET", membership)["data"]["upstreams.json"])["decode"], 120, interval=1)
        pdd = cluster.api("GET", f"/apis/pd.serving.dev/v1alpha1/namespaces/{journey.namespace}/"
                                 f"pddeployments/{journey.name}")
        decode_ready = next(c for c in pdd["status"]["conditions"] if c["type"] == "DecodeReady")
        assert (decode_ready["status"], decode_ready["reason"]) == ("False", "KVLinkNotReady")
        answered(cluster, journey, 503, 60)
    finally:
        cluster.node.ctr("tasks", "resume", probe)
    record = serves_again(cluster, journey)
    assert record["ok"] and record["bytes"] == record["planBytes"] > 0


def prefill_hosts(cluster: NodeCluster, deployment: Deployment) -> set[str]:
    """The prefill instances' hosts the proxy's membership ConfigMap lists."""
    path = f"/api/v1/namespaces/{deployment.namespace}/configmaps/{deployment.name}-proxy"
    members = json.loads(cluster.api("GET", path)["data"]["upstreams.json"])
    return {urlsplit(u["url"]).hostname for u in members["prefill"]}


def linked_hosts(cluster: NodeCluster, deployment: Deployment) -> set[str]:
    """The prefill hosts the decode pod's KV-link gate linked in its last round (GET /link)."""
    decode = engine_pod(deployment, "decode")
    pod = cluster.api("GET", f"/api/v1/namespaces/{deployment.namespace}/pods/{decode}")
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{PROBE_PORT}/link", timeout=10) as answer:
        last = json.loads(answer.read())
    return {p["peer"].rsplit(":", 1)[0] for p in last["peers"] if p["ok"]}


def projected_hosts(cluster: NodeCluster, deployment: Deployment) -> set[str]:
    """The prefill hosts in the decode pod's projection of the proxy's membership ConfigMap: the file
    the kubelet writes into its volume, read in the node's mount namespace."""
    decode = engine_pod(deployment, "decode")
    uid = cluster.api("GET", f"/api/v1/namespaces/{deployment.namespace}/pods/{decode}")["metadata"]["uid"]
    path = cluster.node.in_namespace(
        f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~configmap/membership/upstreams.json")
    members = json.loads(path.read_text())
    return {urlsplit(u["url"]).hostname for u in members["prefill"]}


def test_a_prefill_scale_up_is_linked_at_once_and_projected_at_the_kubelets_sync_then_scales_down(
        node_cluster, journey):
    """The kubelet's default syncFrequency (1 min; the node sets none) and the rendered gate period
    (30 s): `kubectl scale` of the prefill PDRole to 2. The operator pushes the new membership to the
    decode's gate, which links the new instance at once; the kubelet projects the proxy's ConfigMap
    into the decode pod at its own pace (the lag printed: what a gate reading only the file would
    wait). Then `kubectl scale` back to 1 drains the new instance."""
    cluster = node_cluster
    role = f"{journey.name}-prefill"
    kubectl(cluster.kubeconfig, "scale", "pdrole", role, "-n", journey.namespace, "--replicas=2")
    listed = wait_for("two prefill instances in the proxy's membership",
                      lambda: len(hosts := prefill_hosts(cluster, journey)) == 2 and hosts, 300, interval=0.5)
    written = time.monotonic()
    wait_for("the decode's gate linking both", lambda: linked_hosts(cluster, journey) == listed, 300,
             interval=0.5)
    linked = time.monotonic() - written
    wait_for("the kubelet's projection of the new membership", lambda: projected_hosts(cluster, journey)
             == listed, 300, interval=0.5)
    print(f"membership ConfigMap written -> decode gate linked both: {linked:.0f} s (pushed); "
          f"-> the kubelet's projection in the decode pod: {time.monotonic() - written:.0f} s")
    record = serves_again(cluster, journey)
    assert record["ok"]

    kubectl(cluster.kubeconfig, "scale", "pdrole", role, "-n", journey.namespace, "--replicas=1")
    wait_for("one prefill instance in the membership", lambda: len(prefill_hosts(cluster, journey)) == 1, 300,
             interval=1)
    wait_for("the scaled-down prefill's pods gone", lambda: {p["metadata"]["name"] for p in pods(
        cluster, journey, "prefill")} == {engine_pod(journey, "prefill")}, 300, interval=1)
    record = serves_again(cluster, journey)
    assert record["ok"] and record["from"] == f"{journey.namespace}.{journey.name}-prefill-0"


LOAD_CLIENTS_PER_DECODE = 4
"""The rollout's load: this many clients per decode member, so that at least 2 requests are in flight
per decode at every sample (each client sends its next request as soon as its last is answered)."""


def log_lines(cluster: NodeCluster, deployment: Deployment, pod: str,
              container: str) -> list[tuple[datetime, str]]:
    """(time, text) of a container's log lines, timed by the node's container runtime as it wrote them
    (`kubectl logs --timestamps`: RFC 3339 with up to nanoseconds, here cut to microseconds)."""
    logs = kubectl(cluster.kubeconfig, "logs", "-n", deployment.namespace, pod, "-c", container,
                   "--timestamps").stdout
    out = []
    for line in logs.splitlines():
        stamp, _, text = line.partition(" ")
        seconds, _, fraction = stamp.rstrip("Z").partition(".")
        out.append((datetime.fromisoformat(f"{seconds}.{(fraction + '000000')[:6]}+00:00"), text))
    return out


def routing_ended(cluster: NodeCluster, deployment: Deployment, names: set[str], after: datetime) -> datetime:
    """When the last proxy pod loaded a membership (after `after`) listing none of the prefill
    instances `names`: from then on no request of the load could reach them."""
    ends = []
    for pod in pods(cluster, deployment, "proxy"):
        changes = [(at, ast.literal_eval(m.group(1))) for at, text in log_lines(
            cluster, deployment, pod["metadata"]["name"], "proxy")
            if at > after and (m := re.search(r"membership version .* prefill (\[.*?\]), decode", text))]
        end = next((at for at, listed in changes if not names & set(listed)), None)
        assert end, f"proxy pod {pod['metadata']['name']} logged no membership without {sorted(names)}"
        ends.append(end)
    return max(ends)


def pulled_after(cluster: NodeCluster, deployment: Deployment, hosts: set[str],
                 moment: datetime) -> list[dict]:
    """The decode engines' `kv verified` records of KV pulled from a prefill pod at `hosts` (its Mooncake
    segment's host) and logged after `moment`."""
    out = []
    for pod in pods(cluster, deployment, "decode"):
        for at, text in log_lines(cluster, deployment, pod["metadata"]["name"], "vllm"):
            if at > moment and text.startswith(VERIFIED):
                record = json.loads(text[len(VERIFIED):])
                if record.get("segment", "").rsplit(":", 1)[0] in hosts:
                    out.append(record)
    return out


def test_a_prefill_rollout_under_load_keeps_every_decode_ready_and_fails_no_request(node_cluster, journey):
    """The rendered probe periods and the kubelet's default 1 min sync: a prefill template change
    (an env variable) replaces the prefill instance (with the default surge: a new instance first, then
    the old one drained and deleted) while clients keep LOAD_CLIENTS_PER_DECODE completions per decode
    in flight, each with the longest prompt the stand-in carries (the most KV to pull). Every decode
    stays Ready and no request fails; the load had at least 2 requests per decode in flight at every
    sample of the drain (from the old instance leaving the proxy's membership to its pods' deletion),
    and a decode pulled KV from the old prefill pod after the proxy stopped routing to it: a transfer
    was in flight as it drained."""
    cluster = node_cluster
    path = f"/apis/pd.serving.dev/v1alpha1/namespaces/{journey.namespace}/pddeployments/{journey.name}"
    membership = f"/api/v1/namespaces/{journey.namespace}/configmaps/{journey.name}-proxy"

    def members(role: str) -> set[str]:
        return {u["name"] for u in json.loads(cluster.api("GET", membership)["data"]["upstreams.json"])[role]}

    decodes = len(members("decode"))
    old_instances = members("prefill")
    old = {p["metadata"]["uid"]: p for p in pods(cluster, journey, "prefill")}
    old_hosts = {p["status"]["podIP"] for p in old.values()}
    assert decodes and old_instances and old
    unready: set[str] = set()
    drain: dict[str, float] = {}
    in_flight: list[int] = []
    """The load's requests in flight at each sample between the drain's start and the deletion."""

    def rolled() -> bool:
        """Done once the new prefill serves; fails at the first decode seen not Ready or request failed."""
        for pod in pods(cluster, journey, "decode"):
            conditions = pod["status"].get("conditions", [])
            if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                unready.add(pod["metadata"]["name"])
        assert not unready, f"decode pods left Ready during the rollout: {sorted(unready)}"
        assert not load.failed(), [a.body for a in load.failed()[:3]]
        prefills = pods(cluster, journey, "prefill")
        if "began" not in drain and not old_instances & members("prefill"):
            drain["began"] = time.monotonic()
        if "began" in drain and "deleted" not in drain:
            in_flight.append(load.in_flight)
            if not any(p["metadata"]["uid"] in old and "deletionTimestamp" not in p["metadata"]
                       for p in prefills):
                drain["deleted"] = time.monotonic()
        return bool(prefills) and not {p["metadata"]["uid"] for p in prefills} & set(old) and is_ready(
            cluster, journey.namespace, journey.name)

    prompt = ("Where does the KV cache of this prompt go? " * MAX_PROMPT_TOKENS)[:MAX_PROMPT_TOKENS]
    with Load(cluster, journey, clients=LOAD_CLIENTS_PER_DECODE * decodes, prompt=prompt) as load:
        wait_for("the load served", lambda: sum(a.status == 200 for a in load.answers) >= 10, 120)
        patched = datetime.now(UTC)
        env = [*journey.doc["spec"]["prefill"].get("env", []), {"name": "PD_TEST_ROLLOUT", "value": "1"}]
        cluster.api("PATCH", path, {"spec": {"prefill": {"env": env}}},
                    content_type="application/merge-patch+json")
        wait_for("the prefill rolled out", rolled, 900, interval=1)
    assert not load.failed(), [a.body for a in load.failed()[:3]]

    new = pods(cluster, journey, "prefill")
    assert new and not {p["metadata"]["uid"] for p in new} & set(old), "old prefill pods still run"
    for pod in new:
        (engine,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
        assert {"name": "PD_TEST_ROLLOUT", "value": "1"} in engine.get("env", []), pod["metadata"]["name"]
    assert in_flight, "the old prefill's drain was not seen: its instance never left the proxy's membership"
    assert min(in_flight) >= 2 * decodes, f"requests in flight during the drain: {in_flight}"
    ended = routing_ended(cluster, journey, old_instances, patched)
    crossing = pulled_after(cluster, journey, old_hosts, ended)
    assert crossing, "no KV was pulled from the old prefill after the proxy stopped routing to it"
    assert all(r["ok"] and r["bytes"] == r["planBytes"] > 0 for r in crossing)
    record = serves_again(cluster, journey)
    assert record["ok"] and record["segment"].rsplit(":", 1)[0] in {p["status"]["podIP"] for p in new}
    print(f"rollout under load: {len(load.answers)} requests from {LOAD_CLIENTS_PER_DECODE * decodes} "
          f"clients, none failed, every decode Ready; in flight during the drain "
          f"({drain['deleted'] - drain['began']:.0f} s): {min(in_flight)}..{max(in_flight)}; "
          f"{len(crossing)} KV transfers from the old prefill finished after the proxy stopped routing to it")


def test_a_decode_block_size_change_rolls_decode_alone_and_its_new_engine_pulls_from_the_old_prefill(
        node_cluster, journey):
    """Decode's block size alone (twice its engine block; issue 32) under load: no prefill pod is
    replaced and prefill's revision stays; decode's instance is replaced (a surge one first), its new
    engine's KV-link gate links the unchanged prefill (whose pd-kv-probe publishes prefill's side and
    decode's TP), the proxy pairs them (the membership's `pairs`), no request fails, and a completion
    moves verified KV from the old prefill pod into the new decode pod (vllm-ascend PR #16755's token
    runs between unequal blocks, as the stand-in plans them)."""
    cluster = node_cluster
    path = f"/apis/pd.serving.dev/v1alpha1/namespaces/{journey.namespace}/pddeployments/{journey.name}"
    membership = f"/api/v1/namespaces/{journey.namespace}/configmaps/{journey.name}-proxy"
    resolved = validate(journey.doc).resolved
    assert resolved is not None
    block = 2 * resolved.engine_block_size("decode")

    def settled() -> bool:
        """No rollout under way (an earlier test's surge instance drained and gone) and every prefill pod
        of the spec's instances running."""
        status = cluster.api("GET", path).get("status") or {}
        complete = any(c["type"] == "Progressing" and (c["status"], c["reason"]) == ("False", "Complete")
                       for c in status.get("conditions", []))
        live = [p for p in pods(cluster, journey, "prefill") if "deletionTimestamp" not in p["metadata"]]
        return complete and len(pods(cluster, journey, "prefill")) == len(live) == (
            resolved.shapes["prefill"].pods * resolved.role("prefill").replicas) and is_ready(
            cluster, journey.namespace, journey.name)

    wait_for("no rollout under way", settled, 600, interval=1)
    before = cluster.api("GET", path)["status"]
    prefill_pods = {p["metadata"]["uid"]: p["status"]["podIP"] for p in pods(cluster, journey, "prefill")}
    old_decodes = {p["metadata"]["uid"] for p in pods(cluster, journey, "decode")}
    decodes = len(json.loads(cluster.api("GET", membership)["data"]["upstreams.json"])["decode"])
    assert prefill_pods and old_decodes and decodes

    def rolled() -> bool:
        assert not load.failed(), [a.body for a in load.failed()[:3]]
        now = {p["metadata"]["uid"] for p in pods(cluster, journey, "prefill")
               if "deletionTimestamp" not in p["metadata"]}
        assert now == set(prefill_pods), "a prefill pod was replaced"
        new = {p["metadata"]["uid"] for p in pods(cluster, journey, "decode")}
        status = cluster.api("GET", path)["status"]
        done = [c for c in status.get("conditions", []) if c["type"] == "Progressing"
                and (c["status"], c["reason"]) == ("False", "Complete")]
        return bool(new) and not new & old_decodes and bool(done) and is_ready(
            cluster, journey.namespace, journey.name)

    with Load(cluster, journey, clients=LOAD_CLIENTS_PER_DECODE * decodes) as load:
        wait_for("the load served", lambda: sum(a.status == 200 for a in load.answers) >= 10, 120)
        cluster.api("PATCH", path, {"spec": {"decode": {"blockSize": block}}},
                    content_type="application/merge-patch+json")
        wait_for("the decode rolled out", rolled, 900, interval=1)
    assert not load.failed(), [a.body for a in load.failed()[:3]]
    after = cluster.api("GET", path)["status"]
    assert after["prefill"]["revision"] == before["prefill"]["revision"]
    assert after["decode"]["revision"] != before["decode"]["revision"]
    assert after["kvLayout"]["decodeBlockSize"] == block
    doc = json.loads(cluster.api("GET", membership)["data"]["upstreams.json"])
    (prefill_layout,) = {u["layout"] for u in doc["prefill"]}
    (decode_layout,) = {u["layout"] for u in doc["decode"]}
    assert decode_layout != prefill_layout and doc["pairs"] == {decode_layout: prefill_layout}
    record = serves_again(cluster, journey)
    assert record["ok"] and record["bytes"] == record["planBytes"] > 0
    assert record["segment"].rsplit(":", 1)[0] in set(prefill_pods.values())
    print(f"decode block {resolved.engine_block_size('decode')} -> {block}: {len(load.answers)} requests, "
          f"none failed; prefill kept its {len(prefill_pods)} pods; KV moved from the old prefill pod "
          f"({record['bytes']} bytes verified)")

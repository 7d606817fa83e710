"""The real node (tests/support/node.py): the kubelet, containerd, runc and the CNI bridge run pods of
the control plane as containers, and the NPU device-plugin stand-in advertises the Ascend resources.
What only a kubelet shows, on containers containerd lists: probes driving Ready, the devices a pod
was allocated, a killed container restarted, a graceful deletion's SIGTERM, and a node that leaves
nothing on the machine when it stops.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from support import containers, renders
from support.cluster import ROOT, kubernetes_version, wait_for
from support.kube import kubectl
from support.node import (
    BRIDGE_PREFIX,
    NPUS,
    NodeCluster,
    ascend_host_files,
    cgroup_hierarchies,
    run_processes,
    sweep_stale_nodes,
)
from support.specs import EXAMPLES

pytestmark = pytest.mark.node

BASE = containers.BASE_IMAGE
SERVER = "import http.server as h; h.HTTPServer(('', 8080), h.SimpleHTTPRequestHandler).serve_forever()"


@pytest.fixture(scope="module")
def cluster(node_cluster: NodeCluster) -> NodeCluster:
    if BASE not in node_cluster.node.images():
        node_cluster.node.import_podman_image(containers.base_image())
    return node_cluster


@pytest.fixture
def ns(cluster: NodeCluster, request: pytest.FixtureRequest):
    from support.cluster import namespace_name

    name = namespace_name(request.node.name)
    cluster.create_namespace(name)
    yield name
    cluster.delete_namespace(name)


def pod(name: str, command: str, **extra) -> dict:
    container = {"name": "main", "image": BASE, "imagePullPolicy": "Never",
                 "command": ["sh", "-c", command], **extra.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 30, **extra}}


def get_pod(cluster: NodeCluster, ns: str, name: str) -> dict:
    return cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")


def ready(cluster: NodeCluster, ns: str, name: str) -> dict | None:
    p = get_pod(cluster, ns, name)
    conditions = p["status"].get("conditions", [])
    return p if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None


def create_ready(cluster: NodeCluster, ns: str, manifest: dict) -> dict:
    cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", manifest)
    name = manifest["metadata"]["name"]
    return wait_for(f"pod {name} Ready", lambda: ready(cluster, ns, name), timeout=120,
                    alive=cluster.node.components.values())


def containers_of(cluster: NodeCluster, ns: str, name: str) -> list[dict]:
    return [c for c in cluster.node.containers()
            if c["labels"].get("io.kubernetes.pod.namespace") == ns
            and c["labels"].get("io.kubernetes.pod.name") == name
            and c["labels"].get("io.kubernetes.container.name") == "main"]


def test_the_node_is_a_kubelet_on_containerd_with_the_ascend_resources(cluster):
    wide = kubectl(cluster.kubeconfig, "get", "nodes", "-o", "wide").stdout
    print(wide)
    nodes = cluster.api("GET", "/api/v1/nodes")["items"]
    assert [n["metadata"]["name"] for n in nodes] == [cluster.node.name]  # no kwok node
    info = nodes[0]["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    assert info["kubeletVersion"] == kubernetes_version()
    assert "containerd://2." in wide and kubernetes_version() in wide
    allocatable = nodes[0]["status"]["allocatable"]
    assert {r: allocatable.get(r) for r in NPUS} == {r: str(n) for r, n in NPUS.items()}
    assert "kwok" not in cluster.components


def test_the_device_plugin_advertises_the_largest_example_plus_one_surge_instance():
    """Per Ascend resource name, every example's engine NPUs (limits x pods per instance, every
    instance) plus its largest instance once more (the default rollout's one surge instance) fit in
    what the device-plugin stand-in advertises; no example asks for a resource it does not have."""
    needs: dict[tuple[str, str], int] = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        if not renders.validated(path).ok:
            continue
        instances: dict[str, list[int]] = {}
        for engine_set in renders.serving_sets(renders.rendered(path)):
            for name, count in renders.container(engine_set)["resources"]["limits"].items():
                if name.startswith("huawei.com/"):
                    instances.setdefault(name, []).append(int(count) * engine_set["spec"]["replicas"])
        for name, npus in instances.items():
            assert name in NPUS, f"{path.name} asks for {name}"
            needs[path.name, name] = sum(npus) + max(npus)
    assert needs and all(need <= NPUS[name] for (_, name), need in needs.items()), needs
    assert max(needs.values()) == max(NPUS.values()), f"no example needs all of {NPUS}: {needs}"


def test_a_pod_runs_in_containerd_ready_by_its_probe_with_the_npus_it_was_allocated(cluster, ns):
    command = f"echo devices=$ASCEND_VISIBLE_DEVICES; exec python3 -c \"{SERVER}\""
    manifest = pod("server", command, container={
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
        "resources": {"limits": {"huawei.com/Ascend910": "2"}}})
    running = create_ready(cluster, ns, manifest)
    assert running["spec"]["nodeName"] == cluster.node.name
    ip = running["status"]["podIP"]
    assert ipaddress.ip_address(ip) in cluster.node.subnet
    (container,) = containers_of(cluster, ns, "server")
    assert container["image"] == BASE
    assert container["id"] in cluster.node.running_tasks()
    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=10) as answer:  # the pod's own network
        assert answer.status == 200
    logs = kubectl(cluster.kubeconfig, "logs", "-n", ns, "server").stdout  # API server -> kubelet
    (devices,) = [line.split("=", 1)[1] for line in logs.splitlines() if line.startswith("devices=")]
    assert len(devices.split(",")) == 2


@pytest.mark.parametrize("example", ["glm-5.3-flash-1p1d-tp4.yaml", "deepseek-v3.2-multinode-decode.yaml"])
def test_an_engine_pods_npus_and_ascend_host_files_are_admitted_as_on_an_npu_node(cluster, ns, example):
    """The rendered engine's NPU limits (both Ascend resource names across the two examples) and its
    Ascend hostPath volumes, exactly as rendered, in a pod of the base image that checks each mount."""
    (engine_set, *_) = renders.serving_sets(renders.rendered(EXAMPLES / example))
    template, engine = engine_set["spec"]["template"]["spec"], renders.container(engine_set)
    ascend = {path for path, _ in ascend_host_files()}
    volumes = [v for v in template["volumes"] if v.get("hostPath", {}).get("path") in ascend]
    mounts = [m for m in engine["volumeMounts"] if m["name"] in {v["name"] for v in volumes}]
    npus = {k: v for k, v in engine["resources"]["limits"].items() if k in NPUS}
    assert mounts and npus
    checks = " && ".join(f"test -e {m['mountPath']}" for m in mounts)
    on_machine = {path: pathlib.Path(path).exists() for path in ascend}
    running = create_ready(cluster, ns, pod("engine", f"{checks} && touch /tmp/ok && exec sleep 3600",
                                            volumes=volumes, container={
        "volumeMounts": mounts, "resources": {"limits": npus},
        "readinessProbe": {"exec": {"command": ["test", "-e", "/tmp/ok"]}, "periodSeconds": 1}}))
    assert running["spec"]["nodeName"] == cluster.node.name
    assert containers_of(cluster, ns, "engine")
    # DirectoryOrCreate created nothing on the machine: the files live in the node's namespace.
    assert {path: pathlib.Path(path).exists() for path in ascend} == on_machine


def test_a_container_killed_is_restarted_by_the_kubelet(cluster, ns):
    create_ready(cluster, ns, pod("victim", f"exec python3 -c \"{SERVER}\"", container={
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}}))
    (container,) = containers_of(cluster, ns, "victim")
    pid = int(cluster.node.ctr("tasks", "list").stdout.split(container["id"], 1)[1].split()[0])
    os.kill(pid, signal.SIGKILL)

    def restarted() -> dict | None:
        p = ready(cluster, ns, "victim")
        return p if p and p["status"]["containerStatuses"][0]["restartCount"] == 1 else None

    p = wait_for("the container restarted and Ready again", restarted, timeout=120)
    last = p["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 128 + signal.SIGKILL
    assert len(containers_of(cluster, ns, "victim")) == 2  # the dead one and its replacement


def test_a_deleted_pod_gets_sigterm_and_its_containers_go(cluster, ns):
    marker = f"/var/lib/pd-node-test/{ns}"
    script = (f"trap 'echo TERM > {marker}/got; exit 0' TERM; echo up > {marker}/got; "
              "while :; do sleep 0.2; done")
    create_ready(cluster, ns, pod("graceful", script, volumes=[
        {"name": "out", "hostPath": {"path": marker, "type": "DirectoryOrCreate"}}], container={
        "volumeMounts": [{"name": "out", "mountPath": marker}],
        "readinessProbe": {"exec": {"command": ["test", "-s", f"{marker}/got"]}, "periodSeconds": 1}}))
    cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/graceful")
    wait_for("the pod gone", lambda: cluster.find(f"/api/v1/namespaces/{ns}/pods/graceful") is None, 120)
    # The hostPath is in the node's mount namespace (a tmpfs of it), never on the machine.
    got = cluster.node.in_namespace(f"{marker}/got")
    assert got.read_text().strip() == "TERM"
    assert not pathlib.Path(marker).exists()
    wait_for("containerd's containers of the pod gone", lambda: not containers_of(cluster, ns, "graceful"),
             60)


def test_a_configmap_update_reaches_a_running_pods_volume_at_the_kubelets_sync(cluster, ns):
    """The kubelet's default syncFrequency (1 min; the node sets none): the lag printed is the real one."""
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "conf"}, "data": {"value": "one"}}
    cluster.api("POST", f"/api/v1/namespaces/{ns}/configmaps", config)
    serve = "import os; os.chdir('/conf'); " + SERVER
    running = create_ready(cluster, ns, pod("reader", f"exec python3 -c \"{serve}\"", volumes=[
        {"name": "conf", "configMap": {"name": "conf"}}], container={
        "volumeMounts": [{"name": "conf", "mountPath": "/conf"}],
        "readinessProbe": {"httpGet": {"path": "/value", "port": 8080}, "periodSeconds": 1}}))

    def served() -> str:
        with urllib.request.urlopen(f"http://{running['status']['podIP']}:8080/value", timeout=10) as answer:
            return answer.read().decode()

    assert served() == "one"
    config["data"]["value"] = "two"
    cluster.api("PUT", f"/api/v1/namespaces/{ns}/configmaps/conf", config)
    updated = time.monotonic()
    wait_for("the volume updated", lambda: served() == "two", timeout=240, interval=1)
    print(f"configmap projection lag: {time.monotonic() - updated:.0f} s")
    assert get_pod(cluster, ns, "reader")["status"]["containerStatuses"][0]["restartCount"] == 0


def test_pods_resolve_a_headless_services_pods_by_name_through_the_cluster_dns(cluster, ns):
    cluster.api("POST", f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "engines"},
        "spec": {"clusterIP": "None", "selector": {"app": "engine"}, "ports": [{"port": 8080}]}})
    engine = pod("engine-0", f"exec python3 -c \"{SERVER}\"", hostname="engine-0", subdomain="engines",
                 container={"readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}})
    engine["metadata"]["labels"] = {"app": "engine"}
    ip = create_ready(cluster, ns, engine)["status"]["podIP"]

    def published() -> bool:
        slices = cluster.api("GET", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices")["items"]
        return any(e.get("hostname") == "engine-0" and (e.get("conditions") or {}).get("ready")
                   for s in slices for e in s.get("endpoints") or [])

    wait_for("the pod in its Service's EndpointSlice", published, timeout=60)
    fetch = ("import socket, sys, urllib.request as u\n"
             "for name in sys.argv[1:]:\n"
             "    print(name, socket.gethostbyname(name), u.urlopen(f'http://{name}:8080/').status)\n")
    names = ["engine-0.engines", f"engine-0.engines.{ns}.svc.cluster.local", "engines"]
    client = pod("client", "", restartPolicy="Never")
    client["spec"]["containers"][0]["command"] = ["python3", "-c", fetch, *names]
    cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", client)
    wait_for("the client done", lambda: get_pod(cluster, ns, "client")["status"].get("phase")
             in ("Succeeded", "Failed"), 120)
    logs = kubectl(cluster.kubeconfig, "logs", "-n", ns, "client").stdout
    assert get_pod(cluster, ns, "client")["status"]["phase"] == "Succeeded", logs
    assert logs.splitlines() == [f"{name} {ip} 200" for name in names]


def _machine(workdir: pathlib.Path) -> dict:
    """What a node could leave on the machine: mounts (of the paths it mounts over, or under its
    workdir), cgroups, bridges (other runs' containers come and go meanwhile: only ours count)."""
    ours = ("/run", "/var/lib", "/var/log", "/proc/sys", str(workdir))
    mounts = [line.split()[1] for line in pathlib.Path("/proc/self/mounts").read_text().splitlines()]
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    return {
        "mounts": sorted(m for m in mounts if m.startswith(ours)),
        "cgroups": sorted(str(p) for h in cgroup_hierarchies() for p in h.glob("pdnode*")),
        "bridges": sorted(link["ifname"] for link in links if link["ifname"].startswith(BRIDGE_PREFIX)),
    }


def test_a_stopped_node_leaves_nothing_on_the_machine(tmp_path):
    before = _machine(tmp_path)
    cluster = NodeCluster(tmp_path / "cluster").start()
    node = cluster.node
    try:
        node.import_podman_image(containers.base_image())
        cluster.create_namespace("leftovers")
        cluster.api("POST", "/api/v1/namespaces/leftovers/pods", pod("sleeper", "exec sleep 3600"))
        wait_for("the pod Running", lambda: get_pod(cluster, "leftovers", "sleeper")["status"].get("phase")
                 == "Running", 120)
        assert node.leftovers()  # the check sees a running node
        namespace_pid = node.components["namespace"].pid
    finally:
        cluster.stop()
    assert node.leftovers() == []
    assert _machine(tmp_path) == before
    assert not pathlib.Path(f"/proc/{namespace_pid}").exists()
    own = [p for p in pathlib.Path("/proc").iterdir() if p.name.isdigit()
           and str(tmp_path).encode() in _cmdline(p)]
    assert own == []


def _cmdline(proc: pathlib.Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


KILLED_RUN = """
import sys, time, pathlib
from support.cluster import wait_for
from support.node import NodeCluster, PAUSE_IMAGE
cluster = NodeCluster(pathlib.Path(sys.argv[1])).start()
cluster.create_namespace("killed")
cluster.api("POST", "/api/v1/namespaces/killed/pods", {"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "pause"}, "spec": {"containers": [{"name": "main", "image": PAUSE_IMAGE,
    "imagePullPolicy": "Never"}]}})
wait_for("the pod Running", lambda: cluster.api("GET", "/api/v1/namespaces/killed/pods/pause")["status"]
         .get("phase") == "Running", 120)
print(cluster.node.bridge, cluster.node.cgroup_root, cluster.node.components["namespace"].pid, flush=True)
time.sleep(3600)
"""


def test_a_node_of_a_run_killed_with_sigkill_is_swept_by_the_next_start(tmp_path):
    """pytest SIGKILLed with a node running leaves every process it started (their own sessions), the
    pods' containers, the node's mount namespace, cgroups and bridge; the next node's start
    (`sweep_stale_nodes`, the first step of Node.start) removes them all."""
    workdir = tmp_path / "killed-cluster"
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(workdir)], stdout=subprocess.PIPE,
                           text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    try:
        assert run.stdout is not None
        up = run.stdout.readline().split()  # printed once the pod runs: the run's node is up
        assert len(up) == 3, f"the run exited {run.poll()} before its node was up"
        bridge, cgroup_root, holder = up
    finally:
        run.kill()  # SIGKILL: no teardown runs
        run.wait()
    left = run_processes(str(workdir))
    assert left and int(holder) in left  # what a killed run leaves
    assert any(h.joinpath(cgroup_root.lstrip("/")).is_dir() for h in cgroup_hierarchies())
    assert bridge in {link["ifname"] for link in _links()}

    removed = sweep_stale_nodes()
    assert f"bridge {bridge}" in removed
    assert run_processes(str(workdir)) == set()
    # The mount namespace's holder (its last process) is killed: gone, or a zombie until reaped.
    wait_for("the namespace holder dead", lambda: not _alive(int(holder)), 60)
    assert not any(h.joinpath(cgroup_root.lstrip("/")).exists() for h in cgroup_hierarchies())
    assert bridge not in {link["ifname"] for link in _links()}
    mounts = pathlib.Path("/proc/self/mounts").read_text()
    assert str(workdir) not in mounts
    _machine_has_no_node_of(workdir)


def _links() -> list[dict]:
    return json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)


def _machine_has_no_node_of(workdir: pathlib.Path) -> None:
    own = [p.name for p in pathlib.Path("/proc").iterdir() if p.name.isdigit()
           and str(workdir).encode() in _cmdline(p)]
    assert own == []


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (killed, waiting to be reaped)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"

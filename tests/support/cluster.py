"""A real Kubernetes control plane on loopback for tests, benchmarks and the demo.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake nodes that run pods
without containers), all from the one `testcluster` binary built by tools/testcluster (`make
testcluster`), each in its own process, with throwaway PKI (pki.py) and an audit log (audit.py).

    with ControlPlane() as cp:          # or the `control_plane` pytest fixture (fixtures.py)
        cp.kubeconfig                   # admin (system:masters) kubeconfig file
        cp.api("GET", "/api/v1/nodes")  # admin JSON request
        cp.audit.events()               # what the API server saw

The API server aggregates: it calls an APIService's server with a front-proxy client certificate
(support/metrics_api.py registers a custom metrics API). The controller-manager runs the HPA
controller on a 2 s resync.

Nodes: `NodePool`s of kwok nodes advertising NPUs (DEFAULT_NODES: `huawei.com/Ascend910: 8` and
`huawei.com/ascend-1980: 16` labelled `accelerator: ascend-a3`, which the DeepSeek example
selects). Pod IPs are loopback addresses where nothing listens (POD_CIDR), or from a node's own
pod CIDR when its pool gives one (support/podnet.py runs what the pods would there).

Ports are picked below the ephemeral range (32768+): a port found free with bind(0) can be taken
by an outgoing connection before the server binds it. A component that still loses its port to
another process is restarted on a new one.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ipaddress
import json
import os
import pathlib
import random
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from support.audit import AuditLog
from support.pki import CA, service_account_keys

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULE = ROOT / "tools" / "testcluster"
BUILD = MODULE / "build.sh"
HOST = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
# kwok hands out fake pod IPs from here (its default /24 runs out at 254 pods). Loopback addresses
# (any 127.x answers on Linux without setup), so a pod's IP behaves as a real one with nothing
# listening: a connection is refused at once (the operator's drain reads proxy pods; see
# controller/drain.py), and a test can run a real process "in" a pod by binding to its IP.
POD_CIDR = "127.128.0.1/14"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# kwok's own stages (sigs.k8s.io/kwok: kustomize/stage @ the version in go.mod): nodes become Ready
# and renew their Lease, pods go Running and Ready at once, deleted pods go away.
KWOK_STAGES = ("node/fast", "node/heartbeat-with-lease", "pod/fast")
NEVER_READY_IMAGE = "registry.example.com/pd-operator/pd-vllm-ascend:v0.30.0rc2-broken"
"""Pods whose first container runs this image stay Pending for kwok (stage_documents)."""
READY_WHEN_SERVING_ENV = "PD_TEST_READY_WHEN_SERVING"
"""A pod with a container setting this env variable goes Running for kwok but not Ready: the kubelet
emulator (support/podnet.py) marks it Ready once what it runs for the pod serves, as a readiness
probe would (stage_documents). kwok marks every other pod Ready at once."""
# The node lifecycle controller marks a node unreachable when its Lease is older than 40 s
# (--node-monitor-grace-period); kwok's default lease is shorter than its renew interval allows.
NODE_LEASE_SECONDS = 40
# kube-scheduler's gang scheduling, off on a stock v1.36 cluster (alpha; k8s.io/kubernetes:
# pkg/features/kube_features.go @ v1.36.3): the PodGroup API (scheduling.k8s.io/v1alpha2, an alpha
# group version, off unless --runtime-config turns it on) and the scheduler's GangScheduling and
# TopologyPlacement plugins (pkg/scheduler/apis/config/v1/default_plugins.go @ v1.36.3).
# `ControlPlane(gang_scheduling=True)` turns them on in both components.
GANG_FEATURE_GATES = "GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true"
GANG_RUNTIME_CONFIG = "scheduling.k8s.io/v1alpha2=true"
START_TIMEOUT_S = 120.0
FRONT_PROXY_CLIENT = "front-proxy-client"
# The HPA controller's resync (its default is 15 s); a test waits for the scale, never times it.
HPA_SYNC_PERIOD = "2s"
PORT_RANGE = (20000, 32000)

_ports_handed: set[int] = set()
_ports_lock = threading.Lock()


def pick_port(host: str = HOST) -> int:
    """A free port below the ephemeral range, not handed out before by this process."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    with _ports_lock:
        for _ in range(1000):
            port = rng.randrange(*PORT_RANGE)
            if port in _ports_handed:
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _ports_handed.add(port)
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")


def binary() -> pathlib.Path:
    """The testcluster binary for the current tools/testcluster sources (built if missing)."""
    path = pathlib.Path(subprocess.check_output(["bash", str(BUILD), "path"], text=True).strip())
    if not path.is_file():
        print(f"testcluster: {path} is missing; building it (make testcluster does the same)",
              file=sys.stderr, flush=True)
        subprocess.run(["bash", str(BUILD)], check=True, stdout=sys.stderr)
    return path


def _module_version(module: str) -> str:
    for line in (MODULE / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == module and parts[1].startswith("v"):
            return parts[1]
    raise RuntimeError(f"{module} is not required by {MODULE / 'go.mod'}")


def kubernetes_version() -> str:
    """The kube-apiserver version the binary reports (`kubectl version`), e.g. v1.36.3."""
    return _module_version("k8s.io/kubernetes")


_READY_WHEN_SERVING = (f'[.spec.containers[].env[]? | select(.name == "{READY_WHEN_SERVING_ENV}")]'
                       ' | length > 0')
"""kwok's selector key (a jq query) for a pod that READY_WHEN_SERVING_ENV marks: true or false."""


def stage_documents() -> list[dict]:
    """kwok's stages as configured here: its own, with pod-ready skipping pods whose first container
    runs NEVER_READY_IMAGE (a test's image that "crashes": it writes their status itself, and kwok
    must never have marked them Ready first) and pods READY_WHEN_SERVING_ENV marks, which a stage of
    our own, pod-running-unready, takes instead: pod-ready's status with every container, Ready and
    ContainersReady false (their readiness is the kubelet emulator's to give)."""
    out = [yaml.safe_load(f.read_text()) for f in kwok_stages()]
    (ready,) = [stage for stage in out if stage["metadata"]["name"] == "pod-ready"]
    ready["spec"]["selector"]["matchExpressions"].append(
        {"key": ".spec.containers.[0].image", "operator": "NotIn", "values": [NEVER_READY_IMAGE]})
    unready = copy.deepcopy(ready)
    ready["spec"]["selector"]["matchExpressions"].append(
        {"key": _READY_WHEN_SERVING, "operator": "NotIn", "values": ["true"]})
    unready["metadata"]["name"] = "pod-running-unready"
    unready["spec"]["selector"]["matchExpressions"].append(
        {"key": _READY_WHEN_SERVING, "operator": "In", "values": ["true"]})
    unready["spec"]["next"]["statusTemplate"] = _unready(ready["spec"]["next"]["statusTemplate"])
    return [*out, unready]


def _unready(template: str) -> str:
    """kwok's pod-ready status template with Ready, ContainersReady and every container's `ready`
    false (not the init containers': they ran)."""
    conditions, containers = template.split("\ncontainerStatuses:\n", 1)
    containers, init = containers.split("\ninitContainerStatuses:\n", 1)
    out = conditions
    for condition in ("Ready", "ContainersReady"):
        true = f'status: "True"\n  type: {condition}\n'
        if out.count(true) != 1:
            raise RuntimeError(f"kwok's pod-ready template changed: no one {condition} condition to unset")
        out = out.replace(true, f'status: "False"\n  type: {condition}\n')
    if containers.count("ready: true") != 1:
        raise RuntimeError("kwok's pod-ready template changed: no one `ready` of its containers to unset")
    return f"{out}\ncontainerStatuses:\n{containers.replace('ready: true', 'ready: false')}" \
           f"\ninitContainerStatuses:\n{init}"


def kwok_stages() -> list[pathlib.Path]:
    """kwok's stage files from the Go module cache, at the version tools/testcluster builds."""
    version = _module_version("sigs.k8s.io/kwok")
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    cache = subprocess.check_output(["go", "env", "GOMODCACHE"], text=True, env=env).strip()
    root = pathlib.Path(cache) / "sigs.k8s.io" / f"kwok@{version}" / "kustomize" / "stage"
    if not root.is_dir():
        subprocess.run(["go", "mod", "download", f"sigs.k8s.io/kwok@{version}"], cwd=MODULE, env=env,
                       check=True)
    files = [f for stage in KWOK_STAGES for f in sorted((root / stage).glob("*.yaml"))
             if f.name != "kustomization.yaml"]
    if not files:
        raise RuntimeError(f"no kwok stages under {root}")
    return files


@dataclass(frozen=True)
class NodePool:
    """`count` kwok nodes named PREFIX-N, each advertising `npus` of `resource`.

    `pod_cidrs`, one per node when given, is each node's spec.podCIDR: kwok then hands that node's
    pods IPs from it instead of from its --cidr (support/podnet.py makes them loopback addresses)."""

    prefix: str
    count: int
    resource: str
    npus: int
    labels: Mapping[str, str] = field(default_factory=dict)
    pod_cidrs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert not self.pod_cidrs or len(self.pod_cidrs) == self.count, "one pod CIDR per node"

    def nodes(self) -> list[dict]:
        capacity = {"cpu": "256", "memory": "4Ti", "pods": "110", "ephemeral-storage": "100Ti",
                    self.resource: str(self.npus)}
        return [{
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": f"{self.prefix}-{i}",
                "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                "labels": {"kubernetes.io/hostname": f"{self.prefix}-{i}", "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok", **self.labels},
            },
            **({"spec": {"podCIDR": self.pod_cidrs[i]}} if self.pod_cidrs else {}),
            "status": {"capacity": capacity, "allocatable": capacity},
        } for i in range(self.count)]


# Enough for every example at once: GLM TP8 + DP2xTP4 (2 nodes), GLM 1P1D, Qwen3-Next (2+2 pods);
# DeepSeek's 2 prefill instances of 16 and 2 decode pods of 8 on ascend-1980 nodes it selects.
DEFAULT_NODES = (
    NodePool("ascend910", 8, "huawei.com/Ascend910", 8, {"accelerator": "ascend-910"}),
    NodePool("ascend1980", 4, "huawei.com/ascend-1980", 16, {"accelerator": "ascend-a3"}),
)


class ApiError(Exception):
    def __init__(self, status: int, body: str, method: str, path: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class Component:
    """One process (a control-plane component, the operator), its output in `log`."""

    def __init__(self, name: str, argv: list[str], log: pathlib.Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = dict(env) if env is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"--- start {' '.join(self.argv)}\n".encode())
            out.flush()
            # Own session: Ctrl-C in the test run does not reach the cluster before teardown.
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def lost_port(self) -> bool:
        return "address already in use" in self.tail(50)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (as the kubelet stops a pod), SIGKILL after `timeout`; the exit code."""
        if self.process is None:
            return None
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, for tests of what survives a crashed component."""
        if self.running():
            assert self.process is not None
            self.process.kill()
            self.process.wait()


def wait_for(what: str, check: Callable[[], Any], timeout: float = START_TIMEOUT_S,
             interval: float = 0.2, alive: Iterable[Component] = ()) -> Any:
    """Poll `check` until it returns a true value; fail early if a component in `alive` exits."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        for component in alive:
            if not component.running():
                raise RuntimeError(f"{component.name} exited while waiting for {what}:\n{component.tail()}")
        try:
            result = check()
            if result:
                return result
        except (OSError, ApiError, ValueError) as err:
            last = err
        time.sleep(interval)
    raise TimeoutError(f"{what} not within {timeout:.0f} s (last error: {last})")


def kubeconfig_text(server: str, ca_pem: bytes, token: str, user: str = "user") -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
        "current-context": "test",
    }, sort_keys=False)


AUDIT_POLICY = """\
# Metadata for every request: user, verb, resource, response code; no bodies.
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
"""


class ControlPlane:
    """The five processes, started by `start()` (or `with`), stopped by `stop()`.

    `stop(keep=True)` leaves `workdir` (logs/, audit.log, kubeconfigs) for a failed test to read.
    """

    def __init__(self, workdir: pathlib.Path | None = None,
                 nodes: Iterable[NodePool] = DEFAULT_NODES, *, gang_scheduling: bool = False) -> None:
        self.gang_scheduling = gang_scheduling
        self.service_cidr = SERVICE_CIDR
        self.workdir = workdir or pathlib.Path(tempfile.mkdtemp(prefix="pd-testcluster-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs = self.workdir / "logs"
        self.logs.mkdir(exist_ok=True)
        self.node_pools = list(nodes)
        self.components: dict[str, Component] = {}
        self.admin_token = secrets.token_hex(16)
        self._tokens = {name: secrets.token_hex(16)
                        for name in ("kube-controller-manager", "kube-scheduler", "kwok")}
        self.audit = AuditLog(self.workdir / "audit.log")
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.server = ""
        self.port = 0
        self.ca: CA | None = None
        self._ssl: ssl.SSLContext | None = None
        self.start_seconds = 0.0

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(keep=exc[0] is not None)

    def start(self) -> ControlPlane:
        started = time.monotonic()
        exe = str(binary())
        try:
            self._prepare()
            self._start_etcd(exe)
            self._start_apiserver(exe)
            self.create_nodes()
            self._start_workers(exe)
            self.wait_ready()
        except BaseException:
            self.stop(keep=True)
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def stop(self, keep: bool = False) -> None:
        """Stop every component, API server last but one (etcd last); remove workdir unless `keep`."""
        for name in ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            if name in self.components:
                self.components[name].stop()
        if keep:
            print(f"testcluster: kept {self.workdir} (component logs in {self.logs})", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- setup ------------------------------------------------------------------------------

    def _prepare(self) -> None:
        pki = self.workdir / "pki"
        self.ca = CA(pki)
        self.serving = self.ca.serving("apiserver", [HOST, "localhost", "kubernetes", "kubernetes.default",
                                                     "kubernetes.default.svc", self.kubernetes_service_ip])
        self.sa_keys = service_account_keys(pki)
        # The aggregation layer: kube-apiserver calls an APIService's server (support/metrics_api.py)
        # with this client certificate, so that server may trust the user named in X-Remote-User.
        self.front_proxy_ca = CA(pki / "front-proxy", "pd-operator-test-front-proxy-ca")
        self.front_proxy_client = self.front_proxy_ca.client("front-proxy-client", FRONT_PROXY_CLIENT)
        self._ssl = ssl.create_default_context(cadata=self.ca.pem.decode())
        # Static tokens: user, uid, groups. The components' users are the ones the API server's
        # bootstrap RBAC binds (system:kube-controller-manager, system:kube-scheduler); kwok
        # updates every fake node and pod, so it is an admin like a node fleet's operator.
        users = [(self.admin_token, "admin", "admin", "system:masters"),
                 (self._tokens["kube-controller-manager"], "system:kube-controller-manager", "kcm", ""),
                 (self._tokens["kube-scheduler"], "system:kube-scheduler", "ksched", ""),
                 (self._tokens["kwok"], "kwok", "kwok", "system:masters")]
        (self.workdir / "tokens.csv").write_text(
            "".join(f'{t},{u},{i},"{g}"\n' if g else f"{t},{u},{i}\n" for t, u, i, g in users))
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)

    def _launch(self, name: str, argv_for: Callable[[], list[str]], ready: Callable[[], Any],
                attempts: int = 3) -> None:
        """Start a component; if it lost its port to another process, retry on fresh ports."""
        for attempt in range(attempts):
            component = Component(name, argv_for(), self.logs / f"{name}.log")
            self.components[name] = component
            component.start()
            try:
                wait_for(f"{name} ready", ready, alive=[component])
                return
            except RuntimeError:
                if attempt + 1 < attempts and component.lost_port():
                    continue
                raise

    def _start_etcd(self, exe: str) -> None:
        def argv() -> list[str]:
            self.etcd_port, peer = pick_port(), pick_port()
            client_url, peer_url = f"http://{HOST}:{self.etcd_port}", f"http://{HOST}:{peer}"
            shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
            return [exe, "etcd", "--name=test", f"--data-dir={self.workdir / 'etcd'}",
                    f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
                    f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=test={peer_url}",
                    # A test cluster dies with its run: skip fsync on a disk shared by many runs.
                    "--unsafe-no-fsync", "--log-level=warn"]

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://{HOST}:{self.etcd_port}/health", timeout=2) as r:
                return json.load(r).get("health") == "true"

        self._launch("etcd", argv, healthy)

    def _start_apiserver(self, exe: str) -> None:
        def argv() -> list[str]:
            self.port = pick_port()
            self.server = f"https://{HOST}:{self.port}"
            return [exe, "kube-apiserver",
                    f"--etcd-servers=http://{HOST}:{self.etcd_port}",
                    f"--bind-address={HOST}", f"--advertise-address={HOST}", f"--secure-port={self.port}",
                    f"--tls-cert-file={self.serving.cert}", f"--tls-private-key-file={self.serving.key}",
                    f"--token-auth-file={self.workdir / 'tokens.csv'}",
                    "--authorization-mode=Node,RBAC",
                    f"--service-account-key-file={self.sa_keys.cert}",
                    f"--service-account-signing-key-file={self.sa_keys.key}",
                    f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                    f"--service-cluster-ip-range={self.service_cidr}",
                    f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
                    f"--audit-log-path={self.audit.path}", "--audit-log-format=json",
                    "--allow-privileged=true", "--profiling=false",
                    f"--requestheader-client-ca-file={self.front_proxy_ca.cert}",
                    f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                    "--requestheader-username-headers=X-Remote-User",
                    "--requestheader-group-headers=X-Remote-Group",
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                    f"--proxy-client-cert-file={self.front_proxy_client.cert}",
                    f"--proxy-client-key-file={self.front_proxy_client.key}",
                    f"--cert-dir={self.workdir / 'apiserver-certs'}",
                    *self._gang_flags(f"--runtime-config={GANG_RUNTIME_CONFIG}"),
                    *self.apiserver_flags()]

        def ready() -> bool:
            return self._raw("GET", "/readyz", token=self.admin_token) == b"ok"

        self._launch("kube-apiserver", argv, ready)
        self.kubeconfig.write_text(kubeconfig_text(self.server, self.ca_pem, self.admin_token, "admin"))

    def _start_workers(self, exe: str) -> None:
        configs = {}
        for name, token in self._tokens.items():
            configs[name] = self.workdir / f"{name}.kubeconfig"
            configs[name].write_text(kubeconfig_text(self.server, self.ca_pem, token, name))
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text("\n---\n".join(yaml.safe_dump(stage) for stage in stage_documents()))
        argvs = {
            "kube-controller-manager": [
                exe, "kube-controller-manager", f"--kubeconfig={configs['kube-controller-manager']}",
                f"--service-account-private-key-file={self.sa_keys.key}", f"--root-ca-file={self.ca_cert}",
                "--use-service-account-credentials", "--controllers=*,-nodeipam",
                f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
                "--leader-elect=false", "--secure-port=0"],
            "kube-scheduler": [
                exe, "kube-scheduler", f"--kubeconfig={configs['kube-scheduler']}",
                "--leader-elect=false", "--secure-port=0", *self._gang_flags()],
            "kwok": [
                exe, "kwok", f"--kubeconfig={configs['kwok']}", f"--config={stages}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}", f"--cidr={POD_CIDR}",
                f"--node-ip={HOST}"],
        }
        for name, argv in argvs.items():
            if name == "kwok" and not self.node_pools:
                continue  # no fake node to run (support/node.py's cluster has a real one)
            component = Component(name, argv, self.logs / f"{name}.log")
            self.components[name] = component
            component.start()

    @property
    def kubernetes_service_ip(self) -> str:
        """The `kubernetes` Service's ClusterIP: the first address of the service range."""
        return str(ipaddress.ip_network(self.service_cidr).network_address + 1)

    def apiserver_flags(self) -> list[str]:
        """kube-apiserver flags of a kind of control plane (support/node.py's reaches a real kubelet)."""
        return []

    def _gang_flags(self, *extra: str) -> list[str]:
        return [f"--feature-gates={GANG_FEATURE_GATES}", *extra] if self.gang_scheduling else []

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Every component is running, kwok has made every node Ready, and the controller-manager
        has created the `default` ServiceAccount (its controllers are syncing)."""
        alive = list(self.components.values())
        names = [n["metadata"]["name"] for pool in self.node_pools for n in pool.nodes()]

        def nodes_ready() -> bool:
            items = self.api("GET", "/api/v1/nodes")["items"]
            ready = {n["metadata"]["name"] for n in items
                     if any(c["type"] == "Ready" and c["status"] == "True"
                            for c in n.get("status", {}).get("conditions", []))}
            return ready >= set(names)

        wait_for("kwok nodes Ready", nodes_ready, timeout, alive=alive)
        default = "/api/v1/namespaces/default/serviceaccounts/default"
        wait_for("the default ServiceAccount", lambda: self.exists(default), timeout, alive=alive)

    def create_nodes(self) -> None:
        for pool in self.node_pools:
            for node in pool.nodes():
                self.api("POST", "/api/v1/nodes", node)

    # -- access -----------------------------------------------------------------------------

    @property
    def ca_pem(self) -> bytes:
        assert self.ca is not None, "start() first"
        return self.ca.pem

    @property
    def ca_cert(self) -> pathlib.Path:
        assert self.ca is not None, "start() first"
        return self.ca.cert

    @property
    def ssl_context(self) -> ssl.SSLContext:
        assert self._ssl is not None, "start() first"
        return self._ssl

    def write_kubeconfig(self, path: pathlib.Path, token: str, *, server: str | None = None,
                         user: str = "user") -> pathlib.Path:
        """A kubeconfig for `token` against this API server (or `server`, e.g. a fault proxy
        serving a certificate from this control plane's CA)."""
        path.write_text(kubeconfig_text(server or self.server, self.ca_pem, token, user))
        return path

    def _raw(self, method: str, path: str, body: bytes | None = None, *, token: str | None = None,
             content_type: str = "application/json", server: str | None = None) -> bytes:
        request = urllib.request.Request(f"{server or self.server}{path}", data=body, method=method, headers={
            "Authorization": f"Bearer {token or self.admin_token}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self.ssl_context, timeout=30) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, err.read().decode(errors="replace"), method, path) from None

    def api(self, method: str, path: str, body: Any = None, *, token: str | None = None,
            content_type: str = "application/json") -> Any:
        """One request as admin (or `token`); JSON in and out. Raises ApiError on HTTP errors."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        raw = self._raw(method, path, data, token=token, content_type=content_type)
        return json.loads(raw) if raw else None

    def find(self, path: str) -> Any:
        """The object at `path` (admin GET), None when there is none (404)."""
        try:
            return self.api("GET", path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def exists(self, path: str) -> bool:
        return self.find(path) is not None

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        with contextlib.suppress(ApiError):
            self.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": name, "labels": dict(labels or {})}})
        # The controller-manager gives every namespace its `default` ServiceAccount; pods
        # (StatefulSets') are refused until it exists.
        wait_for(f"ServiceAccount default in {name}",
                 lambda: self.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"))

    def delete_namespace(self, name: str) -> None:
        with contextlib.suppress(ApiError):
            self.api("DELETE", f"/api/v1/namespaces/{name}")

    def create_weights_volume(self, namespace: str, claim: str, size: str = "2Ti") -> None:
        """A PersistentVolume (hostPath, never mounted: kwok runs no containers) pre-bound to a new
        ReadOnlyMany claim `claim`: the weights PVC a PDDeployment names. The scheduler refuses pods
        whose claim does not exist or is unbound; the controller-manager binds the two."""
        volume = f"{namespace}-{claim}"[:253]
        self.api("POST", "/api/v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": self.weights_host_path(volume),
                     "claimRef": {"namespace": namespace, "name": claim}}})
        self.api("POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": volume,
                     "resources": {"requests": {"storage": size}}}})

    def weights_host_path(self, volume: str) -> dict:
        """The hostPath of weights volume `volume` (never mounted on kwok's nodes)."""
        return {"path": f"/models/{volume}"}

    def service_account_token(self, namespace: str, name: str, expiration_s: int = 24 * 3600,
                              pod: dict | None = None) -> str:
        """A TokenRequest token of ServiceAccount namespace/name (what a pod of it would mount); bound
        to `pod` when given, as the kubelet binds a projected token: it stops working once that pod
        is deleted."""
        bound = {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                    "uid": pod["metadata"]["uid"]}} if pod else {}
        review = self.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_s, **bound}})
        return str(review["status"]["token"])

    def service_account_kubeconfig(self, namespace: str, name: str, path: pathlib.Path, *,
                                   server: str | None = None) -> pathlib.Path:
        """A kubeconfig holding only a TokenRequest token of the ServiceAccount: the identity a
        pod of it has. Its user in the audit log is system:serviceaccount:NAMESPACE:NAME."""
        return self.write_kubeconfig(path, self.service_account_token(namespace, name), server=server,
                                     user=f"system:serviceaccount:{namespace}:{name}")


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


SLUG = re.compile(r"[^a-z0-9-]+")


def namespace_name(hint: str) -> str:
    """A fresh namespace name from a hint (a test name): DNS-1123, at most 63 characters."""
    slug = SLUG.sub("-", hint.lower()).strip("-")[:48].rstrip("-") or "t"
    return f"{slug}-{secrets.token_hex(3)}"

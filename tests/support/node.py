"""A real node next to the control plane: containerd, runc and the CNI bridge run the pods' containers,
the kubelet (from the testcluster binary) drives them, an NPU device-plugin stand-in advertises the
Ascend resources through the kubelet's device plugin API (tools/testcluster/npu.go).

    with NodeCluster() as cluster:          # a ControlPlane with no kwok node and one real node
        cluster.node.name                   # the Node object's name
        cluster.node.containers()           # what containerd runs (ctr -n k8s.io containers list)
        cluster.node.import_image(archive)  # an OCI archive (podman save --format oci-archive)

The runtime is built by tools/testcluster/node.sh (containerd, its runc shim, ctr, the CNI plugins,
the pause program; runc from apt) into .tools/testnode/<hash>/, the kubelet with the control plane.

What it takes on these machines (each found by trying, issue 31):
- cgroup v1 (hybrid): the kubelet needs `failCgroupV1: false`, the cgroupfs driver, and a cgroup root
  of its own (`cgroupRoot`, one per node, removed at stop) so its pods' cgroups never mix with the
  machine's; no swap check, no node-allocatable enforcement, no iptables chains.
- runc cannot set a sandbox's oom_score_adj -998 (no CAP_SYS_RESOURCE here; every sandbox failed
  with "can't get final child's PID from pipe: EOF"): containerd's `restrict_oom_score_adj`.
- containerd and the kubelet run in a private mount namespace (a holder process made with `unshare
  --mount --propagation private`): tmpfs over /run, /var/lib and /var/log, so the kubelet's fixed
  paths (/var/lib/kubelet/device-plugins, /var/log/pods) and every mount they make (volumes, overlay
  root filesystems, network namespaces) live and die with that namespace; the kernel tunables the
  kubelet sets at start are bind-mounted private copies, so the machine's values never change.
- The Ascend host files engine pods mount (the driver directory, npu-smi, install info; every node
  generation's, pd_operator/spec/host_paths.py) exist only inside that namespace, on a tmpfs over
  /usr/local and an overlay over /etc.
- The pods' network is a bridge of this node only (its name and /24 picked free at start), with the
  node's InternalIP on it: the API server reaches the kubelet there, the tests reach pods at their
  IPs. No masquerade, no forwarding, no kube-proxy: Services' ClusterIPs do not route, but for the
  `kubernetes` Service's (each node cluster has a service range of its own, whose first address is on
  the bridge, where support/tcpforward.py passes port 443 on to kube-apiserver). The pods'
  DNS server is support/clusterdns.py on the node's IP: Services' and their pods' names resolve to the
  ready endpoints' addresses.
Stopping kills what runs in the node's cgroups, then containerd's shims, then the holder (its
mounts and the pods' network namespaces go with it), removes the cgroups and the bridge;
`leftovers()` says what of it would still be on the machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import json
import os
import pathlib
import posixpath
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping

import yaml

from pd_operator.spec.host_paths import GENERATION_MOUNTS
from support.cluster import HOST, ROOT, Component, ControlPlane, binary, pick_port, wait_for

NODE_BUILD = ROOT / "tools" / "testcluster" / "node.sh"
NAMESPACE = "k8s.io"  # containerd's namespace of the CRI plugin
PAUSE_IMAGE = "localhost/pd-test/pause:1"
NODE_NAME = "pd-node"
# The resources the examples request (huawei.com/Ascend910 for the A2 examples, huawei.com/ascend-1980
# for A3's), enough for the largest example (DeepSeek's 2 x 16 prefill + 2 x 8 decode) plus one surge
# instance of 16.
NPUS = {"huawei.com/Ascend910": 64, "huawei.com/ascend-1980": 64}
CGROUP_FS = pathlib.Path("/sys/fs/cgroup")
# What the kubelet writes at start (k8s.io/kubernetes: pkg/kubelet/cm/container_manager_linux.go @
# v1.36.3, setupKernelTunables): private copies inside the node's mount namespace.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
BRIDGE_PREFIX = "pdnode"
BRIDGE_ALIAS = "pd-operator test node of pid "
POD_SUPERNET = "10.244.0.0/16"
# Each node cluster's Services get a /24 of their own: its `kubernetes` ClusterIP is an address of the
# node's bridge, where support/tcpforward.py passes port 443 on to kube-apiserver.
SERVICE_SUPERNET = "10.245.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
WEIGHTS_ROOT = "/var/lib/pd-weights"


def runtime_dir() -> pathlib.Path:
    """The built runtime for the current node.sh (built if missing; `make testcluster` does it too)."""
    path = pathlib.Path(subprocess.check_output(["bash", str(NODE_BUILD), "path"], text=True).strip())
    if not (path / ".built").is_file():
        print(f"testnode: {path} is missing; building it", file=sys.stderr, flush=True)
        subprocess.run(["bash", str(NODE_BUILD)], check=True, stdout=sys.stderr)
    return path


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def cgroup_hierarchies() -> list[pathlib.Path]:
    """The mounted cgroup hierarchies (one per v1 controller set, and the unified one)."""
    mounts = pathlib.Path("/proc/self/mounts").read_text().splitlines()
    return [pathlib.Path(line.split()[1]) for line in mounts if line.split()[2] in ("cgroup", "cgroup2")]


def free_subnet(supernet: str) -> ipaddress.IPv4Network:
    """A /24 of `supernet` that no address or route of the machine is in."""
    used = [ipaddress.IPv4Network(word, strict=False)
            for line in _run("ip", "-4", "-o", "route", "show", "table", "all").stdout.splitlines()
            for word in line.split()[:1] if word[:1].isdigit()]
    candidates = list(ipaddress.IPv4Network(supernet).subnets(new_prefix=24))
    secrets.SystemRandom().shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise RuntimeError(f"no free /24 in {supernet}")


def ascend_host_files() -> list[tuple[str, str]]:
    """(path, hostPath type) of every node generation's Ascend mounts, as the operator renders them."""
    return sorted({mount for mounts in GENERATION_MOUNTS.values() for mount in mounts})


RUN_ENV = "PD_TESTNODE_RUN"
"""Set to the cluster's workdir in the environment of every process of a node (containerd's shims
inherit it): the sweep finds them by it, as it finds the control plane's by that directory in argv."""


def run_processes(workdir: str) -> set[int]:
    """Processes of the test cluster in `workdir`: a path under it in their argv, or their RUN_ENV."""
    marks = (f"{workdir}/".encode(), f"{RUN_ENV}={workdir}".encode())
    found = set()
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            if marks[0] in cmdline or marks[1] in environ.split(b"\0"):
                found.add(int(proc.name))
    return found


def sweep_stale_nodes() -> list[str]:
    """Remove what a node of a test run that died without stopping it (pytest SIGKILLed) left: its
    bridge's alias names the run's pid and its cluster's workdir. Kills the run's processes (the
    control plane, containerd, the kubelet, the mount namespace's holder, the shims, the DNS and
    forwarder: their mounts go with the namespace), then what runs in its cgroups, removes the cgroups,
    the bridge and the workdir. What it removed, as text."""
    removed = []
    links = json.loads(_run("ip", "-j", "-d", "link", "show", "type", "bridge").stdout or "[]")
    for link in links:
        alias, name = link.get("ifalias", ""), link["ifname"]
        if not (name.startswith(BRIDGE_PREFIX) and alias.startswith(BRIDGE_ALIAS)):
            continue
        pid, _, workdir = alias[len(BRIDGE_ALIAS):].partition(" in ")
        if pathlib.Path(f"/proc/{pid}").exists():
            continue  # its run is alive
        if workdir:
            for _ in range(50):
                stale = run_processes(workdir)
                for process in stale:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process, signal.SIGKILL)
                if not stale:
                    break
                removed.append(f"processes {sorted(stale)}")
                time.sleep(0.1)
        root = f"pdnode-{name[len(BRIDGE_PREFIX):]}"
        for _ in range(50):
            cgroups = sorted((p for h in cgroup_hierarchies() for p in [h / root, *(h / root).rglob("*")]
                              if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for cgroup in cgroups:
                for process in _read(cgroup / "cgroup.procs").split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(process), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    cgroup.rmdir()
            if not cgroups:
                break
            removed.append(f"cgroups of {root}")
            time.sleep(0.1)
        _run("ip", "link", "del", name, check=False)
        removed.append(f"bridge {name}")
        if workdir.startswith(tempfile.gettempdir() + "/"):
            shutil.rmtree(workdir, ignore_errors=True)
    return removed


def oci_archive(path: pathlib.Path, name: str, files: Mapping[str, bytes], entrypoint: list[str]) -> None:
    """An OCI image archive (as `podman save --format oci-archive` writes) of one layer holding
    `files` (path -> content, made executable), named `name`."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for file, content in files.items():
            info = tarfile.TarInfo(file.lstrip("/"))
            info.size, info.mode = len(content), 0o755
            tar.addfile(info, io.BytesIO(content))
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Entrypoint": entrypoint},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media: str) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}

    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(config, "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(layer_bytes, "application/vnd.oci.image.layer.v1.tar")]}).encode()
    index = {"schemaVersion": 2, "manifests": [{
        **blob(manifest, "application/vnd.oci.image.manifest.v1+json"),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"org.opencontainers.image.ref.name": name}}]}
    with tarfile.open(path, "w") as tar:
        entries = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
                   "index.json": json.dumps(index).encode(),
                   **{f"blobs/sha256/{d}": data for d, data in blobs.items()}}
        for file, content in entries.items():
            info = tarfile.TarInfo(file)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


class Node:
    """containerd, the kubelet and the NPU device plugin of one node, in a private mount namespace.

    Started by `NodeCluster.start()` after the control plane; `stop()` leaves nothing on the machine."""

    def __init__(self, cluster: NodeCluster, name: str = NODE_NAME) -> None:
        self.cluster = cluster
        self.name = name
        self.id = secrets.token_hex(3)
        self.dir = cluster.workdir / "node"
        self.subnet = free_subnet(POD_SUPERNET)
        self.ip = str(self.subnet.network_address + 1)
        self.bridge = f"{BRIDGE_PREFIX}{self.id}"
        self.cgroup_root = f"/pdnode-{self.id}"
        self.socket = self.dir / "containerd.sock"
        self.kubelet_port = 0
        self.components: dict[str, Component] = {}
        self.runtime = pathlib.Path()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, exe: str) -> None:
        self.runtime = runtime_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.kubelet_port = pick_port(HOST)
        self._make_bridge()
        self._make_cgroups()
        holder = self._start("namespace", [
            "unshare", "--mount", "--propagation", "private", "--", "bash", "-c", self._namespace_script()])
        wait_for("the node's mount namespace", (self.dir / "namespace.ready").exists, alive=[holder])
        config = self._containerd_config()
        self._start("containerd", [str(self.runtime / "containerd"), "--config", str(config)])
        wait_for("containerd", lambda: self.ctr("version", check=False).returncode == 0,
                 alive=[self.components["containerd"]])
        pause = self.dir / "pause.tar"
        oci_archive(pause, PAUSE_IMAGE, {"/pause": (self.runtime / "pause").read_bytes()}, ["/pause"])
        self.import_image(pause)
        self._start_dns()
        self._start("kubelet", [exe, "kubelet", f"--config={self._kubelet_config()}",
                                f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
                                f"--hostname-override={self.name}", f"--node-ip={self.ip}", "--v=2"])
        self._start("npu-device-plugin", [exe, "npu-device-plugin", "--dir=/var/lib/kubelet/device-plugins",
                                          *[f"{r}={n}" for r, n in NPUS.items()]])
        wait_for(f"node {self.name} Ready with its NPUs", self._ready, alive=self.components.values())

    def stop(self) -> None:
        """Everything in reverse; each step runs even when one before it failed."""
        steps = [lambda: self._stop_component("npu-device-plugin"), lambda: self._stop_component("kubelet"),
                 lambda: self._stop_component("clusterdns"), lambda: self._stop_component("tcpforward"),
                 self._kill_cgroup_processes, lambda: self._stop_component("containerd"), self._kill_shims,
                 lambda: self._stop_component("namespace"), self._remove_cgroups, self._remove_bridge]
        errors = []
        for step in steps:
            try:
                step()
            except Exception as err:  # noqa: BLE001 - report every failed step, after trying all
                errors.append(err)
        if errors:
            raise RuntimeError(f"node {self.name}: stopping left errors: {errors}")

    def leftovers(self) -> list[str]:
        """What of this node is still on the machine (empty after stop())."""
        found = []
        if _run("ip", "link", "show", self.bridge, check=False).returncode == 0:
            found.append(f"bridge {self.bridge}")
        if self.subnet.with_prefixlen in _run("ip", "route").stdout:
            found.append(f"route {self.subnet}")
        found += [f"cgroup {h / self.cgroup_root.lstrip('/')}" for h in cgroup_hierarchies()
                  if (h / self.cgroup_root.lstrip("/")).exists()]
        for pid in self._pids_of_node():
            found.append(f"process {pid}")
        mounts = pathlib.Path("/proc/self/mounts").read_text()
        found += [f"mount {line.split()[1]}" for line in mounts.splitlines()
                  if str(self.dir) in line or f"/{self.id}" in line.split()[1]]
        return found

    # -- access -----------------------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`ctr --address SOCKET -n k8s.io ARGS`: containerd's own view of the node."""
        return _run(str(self.runtime / "ctr"), "--address", str(self.socket), "-n", NAMESPACE, *args,
                    check=check)

    def containers(self) -> list[dict]:
        """containerd's containers of this node: id, image and the CRI labels (pod name and namespace,
        container name), from `ctr containers info` of each."""
        ids = self.ctr("containers", "list", "--quiet").stdout.split()
        out = []
        for cid in ids:
            done = self.ctr("containers", "info", cid, check=False)
            if done.returncode == 0:
                info = json.loads(done.stdout)
                out.append({"id": cid, "image": info.get("Image"), "labels": info.get("Labels") or {}})
        return out

    def running_tasks(self) -> set[str]:
        """Ids of containerd's tasks in the RUNNING state."""
        lines = self.ctr("tasks", "list").stdout.splitlines()[1:]
        return {line.split()[0] for line in lines if len(line.split()) >= 3 and line.split()[2] == "RUNNING"}

    def import_image(self, archive: pathlib.Path) -> None:
        """`ctr images import` of an OCI archive into the CRI's namespace (the kubelet sees it)."""
        self.ctr("images", "import", str(archive))

    def import_podman_image(self, image: str, *names: str) -> None:
        """An image of the `images` tier's podman (support/containers.py) into containerd, as `image`
        and each of `names`: `podman save --format oci-archive`, `ctr images import`, `ctr images tag`."""
        from support import containers

        archive = self.dir / f"image-{secrets.token_hex(4)}.tar"
        try:
            containers.podman("save", "--format", "oci-archive", "-o", str(archive), image, timeout=600)
            before = set(self.images())
            self.import_image(archive)
            imported = sorted(set(self.images()) - before) or [image]
            for name in {image, *names} - {imported[0]}:
                self.ctr("images", "tag", "--force", imported[0], name)
        finally:
            archive.unlink(missing_ok=True)

    def images(self) -> list[str]:
        return [name for name in self.ctr("images", "list", "--quiet").stdout.split()
                if not name.startswith("sha256:")]

    def in_namespace(self, path: str) -> pathlib.Path:
        """`path` as the node's mount namespace sees it (its tmpfs /var/lib, /run, /var/log)."""
        return pathlib.Path(f"/proc/{self.components['namespace'].pid}/root") / path.lstrip("/")

    def kubelet_log(self) -> str:
        return self.components["kubelet"].tail(200) if "kubelet" in self.components else ""

    # -- setup ------------------------------------------------------------------------------

    def _start(self, name: str, argv: list[str], *, in_namespace: bool = True,
               env: Mapping[str, str] | None = None) -> Component:
        if in_namespace and name != "namespace":
            holder = self.components["namespace"].pid
            argv = ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--", *argv]
        env = {**(env if env is not None else os.environ), RUN_ENV: str(self.cluster.workdir)}
        component = Component(f"node-{name}", argv, self.cluster.logs / f"node-{name}.log", env)
        self.components[name] = component
        component.start()
        return component

    def _stop_component(self, name: str) -> None:
        if name in self.components:
            self.components[name].stop(timeout=15)

    def _namespace_script(self) -> str:
        """The holder: the node's mounts in its private namespace, then wait to be stopped."""
        tunables = self.dir / "kernel-tunables"
        lines = ["set -e", "for d in /run /var/lib /var/log; do mount -t tmpfs -o mode=755 tmpfs $d; done",
                 "mkdir -p /var/lib/kubelet/device-plugins /var/log/pods /run/containerd",
                 f"mkdir -p {tunables}"]
        for tunable in KERNEL_TUNABLES:
            copy = tunables / tunable.replace("/", "_")
            lines += [f"cat /proc/sys/{tunable} > {copy}", f"mount --bind {copy} /proc/sys/{tunable}"]
        # The Ascend host files engine pods mount (every node generation's), on a tmpfs over /usr/local
        # and an overlay over /etc: the kubelet finds them as on an NPU node, the machine never has them.
        etc = self.dir / "etc-overlay"
        lines += ["mount -t tmpfs -o mode=755 tmpfs /usr/local", f"mkdir -p {etc}/upper {etc}/work",
                  f"mount -t overlay overlay -o lowerdir=/etc,upperdir={etc}/upper,workdir={etc}/work /etc"]
        for path, kind in ascend_host_files():
            if not path.startswith(("/usr/local/", "/etc/")):
                raise RuntimeError(f"the node cannot provide {path} without touching the machine")
            lines += [f"mkdir -p {path}" if kind.startswith("Directory") else
                      f"mkdir -p {posixpath.dirname(path)} && : > {path}"]
        lines += [f"touch {self.dir / 'namespace.ready'}", "trap 'exit 0' TERM INT",
                  "while :; do sleep 3600 & wait $!; done"]
        return "\n".join(lines)

    def _start_dns(self) -> None:
        """support/clusterdns.py on the node's IP (port 53), reading the API as admin; and
        support/tcpforward.py on the `kubernetes` Service's ClusterIP, port 443, for pods' clients."""
        token = self.dir / "dns.token"
        token.touch(mode=0o600)
        token.write_text(self.cluster.admin_token)
        cp = self.cluster
        self._start_helper("clusterdns", f"--listen={self.ip}", f"--server={cp.server}",
                           f"--token-file={token}", f"--ca-file={cp.ca_cert}", f"--domain={CLUSTER_DOMAIN}")
        self._start_helper("tcpforward", f"{cp.kubernetes_service_ip}:443", f"{HOST}:{cp.port}")

    def _start_helper(self, module: str, *args: str) -> None:
        """A support module of ours as a process on the machine (outside the namespace), up when it
        prints its first line (`MODULE: ...`)."""
        helper = self._start(module, [sys.executable, "-m", f"support.{module}", *args], in_namespace=False,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
        wait_for(f"{module} serving", lambda: f"{module}: " in helper.tail(5), alive=[helper])

    def _make_bridge(self) -> None:
        sweep_stale_nodes()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        alias = f"{BRIDGE_ALIAS}{os.getpid()} in {self.cluster.workdir}"  # what sweep_stale_nodes reads
        _run("ip", "link", "set", self.bridge, "alias", alias)
        _run("ip", "addr", "add", f"{self.ip}/{self.subnet.prefixlen}", "dev", self.bridge)
        _run("ip", "addr", "add", f"{self.cluster.kubernetes_service_ip}/32", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def _remove_bridge(self) -> None:
        if _run("ip", "link", "show", self.bridge, check=False).returncode == 0:
            _run("ip", "link", "del", self.bridge)

    def _make_cgroups(self) -> None:
        for hierarchy in cgroup_hierarchies():
            path = hierarchy / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            for inherited in ("cpuset.cpus", "cpuset.mems"):  # an empty cpuset takes no process
                if (hierarchy / inherited).exists():
                    (path / inherited).write_text((hierarchy / inherited).read_text())

    def _cgroup_dirs(self) -> list[pathlib.Path]:
        """Every cgroup of the node, deepest first."""
        dirs = []
        for hierarchy in cgroup_hierarchies():
            root = hierarchy / self.cgroup_root.lstrip("/")
            if root.is_dir():
                dirs += [root, *(p for p in root.rglob("*") if p.is_dir())]
        return sorted(dirs, key=lambda p: len(p.parts), reverse=True)

    def _pids_of_node(self) -> set[int]:
        pids = set()
        for d in self._cgroup_dirs():
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        for component in self.components.values():
            if component.running() and component.pid:
                pids.add(component.pid)
        pids |= self._shims()
        return pids

    def _kill_cgroup_processes(self) -> None:
        def empty() -> bool:
            pids = {int(p) for d in self._cgroup_dirs() for p in _read(d / "cgroup.procs").split()}
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not pids

        wait_for("the node's containers gone", empty, timeout=60)

    def _shims(self) -> set[int]:
        """containerd-shim-runc-v2 processes of this node's containerd (by its socket address)."""
        found = set()
        for proc in pathlib.Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                # containerd runs the shim beside its own resolved executable: match the name only.
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if argv[0].endswith(b"/containerd-shim-runc-v2") and str(self.socket).encode() in argv:
                    found.add(int(proc.name))
        return found

    def _kill_shims(self) -> None:
        def gone() -> bool:
            pids = self._shims()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not pids

        wait_for("containerd's shims gone", gone, timeout=30)

    def _remove_cgroups(self) -> None:
        def removed() -> bool:
            for d in self._cgroup_dirs():
                with contextlib.suppress(OSError):
                    d.rmdir()
            return not self._cgroup_dirs()

        wait_for("the node's cgroups removed", removed, timeout=30)

    def _containerd_config(self) -> pathlib.Path:
        cni = self.dir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-pd-node.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "pd-node",
            "plugins": [
                # No isGateway/ipMasq: nothing to forward or masquerade (the bridge holds the node's IP,
                # which pods reach on their own subnet), so the machine's sysctls and tables stay as
                # they were.
                {"type": "bridge", "bridge": self.bridge, "ipam": {
                    "type": "host-local", "ranges": [[{"subnet": str(self.subnet), "gateway": self.ip}]],
                    "routes": [{"dst": self.cluster.service_cidr, "gw": self.ip}],
                    "dataDir": str(self.dir / "ipam")}},
                {"type": "loopback"}]}))
        config = self.dir / "containerd.toml"
        config.write_text(f"""\
version = 4
root = '{self.dir / "containerd"}'
state = '/run/containerd'

[plugins.'io.containerd.server.v1.grpc']
  address = '{self.socket}'

[plugins.'io.containerd.server.v1.ttrpc']
  address = '{self.socket}.ttrpc'

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '{PAUSE_IMAGE}'

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['{self.runtime / "cni"}']
  conf_dir = '{cni}'

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '{HOST}'
""")
        return config

    def _kubelet_config(self) -> pathlib.Path:
        cp = self.cluster
        serving = cp.ca.serving("kubelet", [self.ip, self.name])  # type: ignore[union-attr]
        cp.write_kubeconfig(self.dir / "kubelet.kubeconfig", cp.node_token, user=f"system:node:{self.name}")
        resolv = self.dir / "resolv.conf"
        resolv.write_text(f"nameserver {self.ip}\n")
        config = self.dir / "kubelet.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "failSwapOn": False, "enforceNodeAllocatable": [], "makeIPTablesUtilChains": False,
            "address": self.ip, "port": self.kubelet_port, "readOnlyPort": 0, "healthzPort": 0,
            "tlsCertFile": str(serving.cert), "tlsPrivateKeyFile": str(serving.key),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(cp.ca_cert)}},
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDomain": CLUSTER_DOMAIN, "clusterDNS": [self.ip], "resolvConf": str(resolv),
            # A disk shared with every other test run: never evict or collect images for it.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "registerNode": True,
        }, sort_keys=False))
        return config

    def _ready(self) -> bool:
        node = self.cluster.find(f"/api/v1/nodes/{self.name}")
        if not node:
            return False
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in node["status"].get("conditions", []))
        allocatable = node["status"].get("allocatable", {})
        return ready and all(allocatable.get(r) == str(n) for r, n in NPUS.items())


def _read(path: pathlib.Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class NodeCluster(ControlPlane):
    """The control plane with one real node (`node`) instead of kwok's: kube-apiserver reaches the
    kubelet at the node's InternalIP with a client certificate of the cluster's CA."""

    def __init__(self, workdir: pathlib.Path | None = None) -> None:
        super().__init__(workdir, nodes=())
        self.service_cidr = str(free_subnet(SERVICE_SUPERNET))
        self.node_token = secrets.token_hex(16)
        self.node: Node = Node(self)

    def _prepare(self) -> None:
        super()._prepare()
        # The kubelet's identity, as the Node authorizer wants it (user system:node:NAME, system:nodes).
        with (self.workdir / "tokens.csv").open("a") as tokens:
            tokens.write(f'{self.node_token},system:node:{self.node.name},kubelet,"system:nodes"\n')
        assert self.ca is not None
        self.kubelet_client = self.ca.client("apiserver-kubelet-client", "kube-apiserver-kubelet-client")

    def apiserver_flags(self) -> list[str]:
        return [f"--kubelet-client-certificate={self.kubelet_client.cert}",
                f"--kubelet-client-key={self.kubelet_client.key}",
                f"--kubelet-certificate-authority={self.ca_cert}",
                "--kubelet-preferred-address-types=InternalIP"]

    def weights_host_path(self, volume: str) -> dict:
        """Weights claims bind to a local volume of the node: a directory under WEIGHTS_ROOT that the
        kubelet creates in the node's mount namespace (its tmpfs /var/lib), so engine pods mount it as
        the examples render and the machine never has it."""
        return {"path": f"{WEIGHTS_ROOT}/{volume}", "type": "DirectoryOrCreate"}

    def start(self) -> NodeCluster:
        super().start()
        try:
            self.node.start(str(binary()))
        except BaseException:
            self.stop(keep=True)
            raise
        return self

    def stop(self, keep: bool = False) -> None:
        try:
            self.node.stop()
        finally:
            super().stop(keep)


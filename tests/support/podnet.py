"""A loopback pod network for kwok, and a kubelet emulator that runs what the pods of one
PDDeployment would run, each on its pod's IP: the real `pd-proxy` and fake vLLM engines.

Why: scaling under load on the real control plane needs the processes where the API says the pods
are. The operator asks each proxy pod `GET http://<podIP>:<admin port>/pd/state` before it deletes an
instance, the proxy reaches the engines by their pods' DNS names, and a client reaches the proxy
pod; so pod IPs must be addresses this machine serves, and pod names must resolve to them.

The network: kwok hands a pod an IP from its node's spec.podCIDR when the node has one
(sigs.k8s.io/kwok: pkg/kwok/controllers/pod_controller.go @ v0.8.0, funcPodIPWith), and the
controller-manager here runs without nodeipam (support/cluster.py), so nothing replaces it.
`loopback(pool)` gives each node of a pool a /24 of 127.0.0.0/8, which Linux routes to the
loopback interface without any setup: every pod IP can be bound and dialled here.

The kubelet (`Kubelet`), for the pods of one PDDeployment, following the API (listed every
SYNC_S, and at once on a pod event: kwok removes a deleted pod at once and the StatefulSet
recreates it, so a slower kubelet would leave the old process serving under the name):
- a proxy pod: its container's own command and port, with what only a pod has put back in: its
  ConfigMap volumes (each key a file of the pod's own directory, replaced atomically, as the kubelet
  swaps a projected volume: at the start, then every CONFIG_MAP_SYNC_S as the kubelet's periodic
  sync does, so only a watch through the API sees a change sooner), its ServiceAccount volume (the
  `kube-api-access-*` volume the API server's ServiceAccount admission added: a TokenRequest token
  bound to the pod, the cluster CA, the namespace) and the API server's address in
  KUBERNETES_SERVICE_HOST/PORT, as a kubelet gives every container, its own address for the wildcard
  (all pods share loopback, so each binds its IP) and pod DNS (support/poddns.py answers pod names
  from a file kept here as CoreDNS answers them from the API: pods of a headless Service);
- the leader pod (pod-index 0) of a prefill or decode instance: a FakeEngine named as the
  instance (its StatefulSet), on the pod's IP and its container's `http` port, with the pod's
  kv-layout hash (a decode refuses KV of another layout);
- a pod that is deleted: what ran for it is killed (SIGKILL, connections reset), so a deletion
  while a request is in flight there fails that request. The pod object goes only after that, as
  a kubelet deletes a pod's object once its containers stopped: every pod a process runs for
  carries the finalizer FINALIZER, removed after the kill (kwok's pod-delete stage deletes at once
  and would let the StatefulSet create the new pod of that name while the old process still
  answers under it, which no cluster does).
- readiness: kwok marks a pod Ready at once, unless a container of it sets READY_WHEN_SERVING_ENV
  (support/cluster.py: kwok then runs it un-Ready); such a prefill or decode pod is marked Ready
  here (Ready, ContainersReady, every container ready: the KV-link gate's too) only once its
  instance's engine listens, as its readiness probe would make it, so the operator routes to no
  instance before it serves. Without the variable readiness says nothing about what runs here: wait
  for the process (`engine()`, `proxy()`), never for the pod's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from pd_operator.api.labels import DEPLOYMENT, KV_LAYOUT, POD_INDEX, ROLE
from pd_operator.api.types import ROLES
from pd_operator.proxy.membership import Membership, ProxyState
from pd_operator.proxy.watch import HOST_ENV, PORT_ENV, SERVICE_ACCOUNT_DIR
from pd_operator.render.proxy import ADMIN_PORT_NAME, METRICS_PORT_NAME, members
from pd_operator.render.proxy import COMPONENT as PROXY
from support.cluster import HOST, READY_WHEN_SERVING_ENV, ApiError, ControlPlane, NodePool
from support.fakevllm import WAIT_S, FakeEngine, ProxyProcess, project, until

WILDCARD = "0.0.0.0"
POD_DNS = Path(__file__).with_name("poddns.py")
SYNC_S = 0.2
CONFIG_MAP_SYNC_S = 60.0
"""The kubelet's default sync period: how often it projects a changed ConfigMap into a running pod
(its ConfigMap cache TTL can add as much again)."""
API_POLL_S = 0.1
"""How often to ask the API server when waiting for what it holds."""
FINALIZER = "podnet.pd-operator.test/kubelet"
"""On every pod the emulator runs a process for, until that process is killed (module docstring)."""


def loopback(pool: NodePool) -> NodePool:
    """`pool` with a /24 of loopback addresses per node, 127.<n>.<node>.0/24. `n` is random, and below
    the default pod CIDR (support/cluster.py POD_CIDR, 127.128.0.0/14) that every control plane on
    this machine hands out alike, so that pods of runs sharing the machine rarely share an address
    (the ports on it are the pods'): no other run's operator reads this run's proxy pods."""
    n = random.Random(os.getpid() ^ time.monotonic_ns()).randrange(16, 128)
    return dataclasses.replace(pool, pod_cidrs=tuple(f"127.{n}.{i}.0/24" for i in range(pool.count)))


def _labels(obj: dict) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _ready_when_serving(pod: dict) -> bool:
    return any(e.get("name") == READY_WHEN_SERVING_ENV
               for c in pod["spec"]["containers"] for e in c.get("env") or [])


def pod_port(container: dict, name: str) -> int:
    """The container's port of that name."""
    (port,) = [p["containerPort"] for p in container.get("ports") or [] if p.get("name") == name]
    return int(port)


def _http_port(container: dict) -> int:
    return pod_port(container, "http")



def _owner(pod: dict, kind: str) -> str:
    (name,) = [o["name"] for o in pod["metadata"].get("ownerReferences") or [] if o["kind"] == kind]
    return str(name)


def pod_dns(namespace: str, pods: list[dict], services: list[dict]) -> dict[str, str]:
    """The pod names CoreDNS answers: `<hostname>.<subdomain>.<namespace>.svc` of each pod with an IP
    that a headless Service named like its subdomain selects (ready, or the Service publishes
    not-ready addresses)."""
    headless = {s["metadata"]["name"]: s["spec"] for s in services if s["spec"].get("clusterIP") == "None"}
    out = {}
    for pod in pods:
        spec, ip = pod["spec"], pod["status"].get("podIP")
        service = headless.get(spec.get("subdomain", ""))
        if not (ip and spec.get("hostname") and service):
            continue
        selected = (service.get("selector") or {}).items() <= _labels(pod).items()
        if selected and (service.get("publishNotReadyAddresses") or _ready(pod)):
            out[f"{spec['hostname']}.{spec['subdomain']}.{namespace}.svc"] = ip
    return out


EngineFactory = Callable[[str, str, dict, dict], FakeEngine]
"""(instance, role, pod, its serving container) -> the engine to start for it."""


def plain_engine(instance: str, role: str, pod: dict, container: dict) -> FakeEngine:
    """A `FakeEngine` on the pod's IP and `http` port, carrying its kv-layout hash."""
    return FakeEngine(instance, role, host=pod["status"]["podIP"], port=_http_port(container),
                      layout=_labels(pod).get(KV_LAYOUT, ""))


class Kubelet:
    """Runs what the pods of PDDeployment `deployment` in `namespace` would run (module docstring),
    while inside `async with`."""

    def __init__(self, cp: ControlPlane, namespace: str, deployment: str, workdir: Path,
                 engine: EngineFactory | None = None) -> None:
        self.cp, self.namespace, self.deployment = cp, namespace, deployment
        self.engine_for = engine or plain_engine
        """Builds the engine an instance's leader pod runs (`plain_engine` unless given)."""
        self.pairs: dict[str, str] = {}
        """The kv-layouts the membership ConfigMap pairs as another, shared with every engine."""
        self._projected: dict[str, float] = {}
        """Proxy pod uid -> when its ConfigMap volumes were last projected."""
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hosts = workdir / "pod-dns.json"
        project(self.hosts, "{}")
        self.engines: dict[str, FakeEngine] = {}
        """Pod uid -> the engine running for it."""
        self.proxies: dict[str, ProxyProcess] = {}
        self.started: list[FakeEngine] = []
        """Every engine started, the killed ones too (what they received, their errors)."""
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._failure: BaseException | None = None

    async def __aenter__(self) -> Kubelet:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        # The flag, not only the cancel: Python 3.11's wait_for can swallow a cancellation that
        # lands as its wait completes (a pod event then), and the loop would go on for ever.
        self._stopping = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(e.stop() for e in self.engines.values()),
                             *(p.stop() for p in self.proxies.values()))
        # Nothing runs for the pods any more: none waits for this emulator to be deleted.
        for pod in await asyncio.to_thread(self._list, "pods", f"{DEPLOYMENT}={self.deployment}"):
            await asyncio.to_thread(self._finalized, pod)
        if exc[0] is not None:
            for log in sorted(self.workdir.glob("*/proxy.log")):
                print(f"--- {log} ---\n{log.read_text()[-20000:]}")
        elif self._failure is not None:
            raise self._failure

    # --- what the test reads ------------------------------------------------------------------------

    def _check(self) -> None:
        if self._failure is not None:
            raise AssertionError(f"the kubelet emulator failed: {self._failure!r}") from self._failure

    def running(self, instance: str) -> FakeEngine | None:
        self._check()
        return next((e for e in self.engines.values() if e.name == instance), None)

    async def engine(self, instance: str) -> FakeEngine:
        """The engine running for instance `instance`'s leader pod (waits for it to start)."""
        return await until(f"an engine for {instance}", lambda: self.running(instance), WAIT_S * 2)

    async def proxy(self) -> ProxyProcess:
        """The proxy pod's process (waits for one; there must be exactly one)."""
        def one() -> ProxyProcess | None:
            self._check()
            assert len(self.proxies) <= 1, f"{len(self.proxies)} proxy pods"
            return next(iter(self.proxies.values()), None)
        return await until("the proxy pod's process", one, WAIT_S * 2)

    async def membership(self) -> Membership | None:
        """The membership in the deployment's proxy ConfigMap (None: no ConfigMap, or none that parses)."""
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/{self.deployment}-proxy"
        config_map = await asyncio.to_thread(self.cp.find, path)
        return members(config_map) if config_map else None

    async def routed(self, prefill: set[str], decode: set[str], timeout: float = WAIT_S * 4) -> ProxyState:
        """Wait until the proxy ConfigMap lists exactly these instances and the proxy pod routes by
        it; the proxy's state then."""
        async def listed() -> Membership | None:
            found = await self.membership()
            names = found and ({u.name for u in found.prefill}, {u.name for u in found.decode})
            return found if names == (prefill, decode) else None
        found = await until(f"the membership prefill {sorted(prefill)}, decode {sorted(decode)}", listed,
                            timeout, API_POLL_S)
        return await (await self.proxy()).wait_version(found.version)

    def membership_sources(self) -> list[str]:
        """Where the proxy pods took each membership version they applied from, in order."""
        return membership_sources(*sorted(self.workdir.glob("*/proxy.log")))

    def errors(self) -> list[str]:
        """Protocol violations and failed KV pulls any engine saw."""
        return [e for engine in self.started for e in engine.errors]

    # --- the loop -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        # A pod event starts a round at once (module docstring): a real kubelet stops a deleted
        # pod's containers before the pod goes.
        changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        watcher = threading.Thread(target=watch_pods, daemon=True, args=(
            self.cp, self.namespace, f"{DEPLOYMENT}={self.deployment}",
            lambda _type, _pod: loop.call_soon_threadsafe(changed.set), stop))
        watcher.start()
        try:
            while not self._stopping:
                changed.clear()
                try:
                    observed = await asyncio.to_thread(self._observe)
                except (ApiError, OSError) as err:  # the API server is busy: the next round sees it
                    print(f"kubelet emulator: {err}", file=sys.stderr)
                else:
                    await self._sync(*observed)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), SYNC_S)
        except Exception as err:  # handed to the test by _check()
            self._failure = err
        finally:
            stop.set()

    def _patch_finalizers(self, pod: dict, change: dict) -> dict:
        """Strategic-merge `change` into this very pod's metadata (its uid a precondition: 409 or
        422 when another pod of that name is there now)."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}"
        return dict(self.cp.api("PATCH", path, {"metadata": {"uid": pod["metadata"]["uid"], **change}},
                                content_type="application/strategic-merge-patch+json"))

    def _finalizing(self, pod: dict) -> bool:
        """Put FINALIZER on `pod` before a process runs for it; False: the pod is gone or being
        deleted (run nothing for it)."""
        if FINALIZER in (pod["metadata"].get("finalizers") or []):
            return True
        try:
            got = self._patch_finalizers(pod, {"finalizers": [FINALIZER]})
        except ApiError as err:
            if err.status in (404, 409, 422):  # gone, or another pod of that name now (uid differs)
                return False
            raise
        return not got["metadata"].get("deletionTimestamp")

    def _finalized(self, pod: dict) -> None:
        """Take FINALIZER off `pod` (its process, if any, was killed): a deleted pod then goes."""
        if FINALIZER not in (pod["metadata"].get("finalizers") or []):
            return
        with contextlib.suppress(ApiError):  # gone already, or another pod of that name now
            self._patch_finalizers(pod, {"$deleteFromPrimitiveList/finalizers": [FINALIZER]})

    def _list(self, resource: str, selector: str = "") -> list[dict]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        return list(self.cp.api("GET", f"/api/v1/namespaces/{self.namespace}/{resource}{query}")["items"])

    def _observe(self) -> tuple[list[dict], list[dict], dict[str, dict]]:
        pods = self._list("pods", f"{DEPLOYMENT}={self.deployment}")
        services = self._list("services")
        config_maps = {c["metadata"]["name"]: c for c in self._list("configmaps")}
        return pods, services, config_maps

    async def _sync(self, pods: list[dict], services: list[dict], config_maps: dict[str, dict]) -> None:
        live = {p["metadata"]["uid"]: p for p in pods
                if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")}
        # Gone first: kwok may hand a deleted pod's IP to the next pod at once.
        for uid in [u for u in self.engines if u not in live]:
            await self.engines.pop(uid).kill()
        for uid in [u for u in self.proxies if u not in live]:
            self.proxies.pop(uid).kill()
            self._projected.pop(uid, None)
        for pod in pods:  # killed (or never run): the pod object may go
            if pod["metadata"]["uid"] not in live:
                await asyncio.to_thread(self._finalized, pod)
        project_if_changed(self.hosts, json.dumps(pod_dns(self.namespace, list(live.values()), services)))
        if (listed := members(config_maps.get(f"{self.deployment}-proxy") or {})) is not None:
            self.pairs.clear()
            self.pairs.update(listed.pairs)
        for uid, pod in live.items():
            role = _labels(pod).get(ROLE)
            if role == PROXY:
                await self._proxy_pod(uid, pod, config_maps)
            elif role in ROLES and _labels(pod).get(POD_INDEX) == "0" and uid not in self.engines:
                if not await asyncio.to_thread(self._finalizing, pod):
                    continue  # deleted meanwhile: the next round sees it
                (container,) = [c for c in pod["spec"]["containers"] if c.get("ports")
                                and any(p.get("name") == "http" for p in c["ports"])]
                instance = _owner(pod, "StatefulSet")
                # One engine per instance at a time: the finalizer keeps a new pod of the name away
                # until the old one's engine is killed.
                if any(e.name == instance for e in self.engines.values()):
                    raise AssertionError(f"pod {pod['metadata']['name']} of {instance} runs while the "
                                         "engine of its previous pod still does")
                engine = self.engine_for(instance, role, pod, container)
                engine.pairs = self.pairs
                await engine.start()
                self.engines[uid] = engine
                self.started.append(engine)
        for pod in live.values():  # after the engines started: a pod is Ready once its instance serves
            if (_labels(pod).get(ROLE) in ROLES and _ready_when_serving(pod) and not _ready(pod)
                    and self.running(_owner(pod, "StatefulSet"))):
                await asyncio.to_thread(self._mark_ready, pod)

    def _mark_ready(self, pod: dict) -> None:
        """Write `pod`'s status Ready as the kubelet does once its readiness probes pass (this very
        pod: its uid a precondition; gone or replaced meanwhile, nothing to do)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = pod.get("status") or {}
        change = {"metadata": {"uid": pod["metadata"]["uid"]}, "status": {
            "conditions": [{"type": condition, "status": "True", "lastTransitionTime": now}
                           for condition in ("Ready", "ContainersReady")],
            "containerStatuses": [{**c, "ready": True} for c in status.get("containerStatuses") or []]}}
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}/status"
        try:
            self.cp.api("PATCH", path, change, content_type="application/strategic-merge-patch+json")
        except ApiError as err:
            if err.status not in (404, 409, 422):
                raise

    async def _proxy_pod(self, uid: str, pod: dict, config_maps: dict[str, dict]) -> None:
        name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
        (container,) = pod["spec"]["containers"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts = {m["mountPath"]: self.workdir / name / m["name"] for m in container.get("volumeMounts") or []
                  if m["name"] in volumes}
        by_directory = {directory: volumes[directory.name] for directory in mounts.values()}
        wanted = {v["configMap"]["name"] for v in by_directory.values() if "configMap" in v}
        if uid not in self.proxies and any(c not in config_maps for c in wanted):
            return  # the kubelet cannot mount the volume yet: the container does not start
        now = time.monotonic()
        if uid not in self.proxies or now - self._projected[uid] >= CONFIG_MAP_SYNC_S:
            self._projected[uid] = now
            for directory, volume in by_directory.items():
                if "configMap" in volume and volume["configMap"]["name"] in config_maps:
                    project_config_map(directory, config_maps[volume["configMap"]["name"]])
        if uid in self.proxies or not await asyncio.to_thread(self._finalizing, pod):
            return
        for directory, volume in by_directory.items():
            if "projected" in volume:
                await asyncio.to_thread(self._project, directory, volume["projected"], pod, config_maps)
        argv = [in_pod(a, ip, mounts) for a in [*container.get("command", []), *container.get("args", [])]]
        argv += ["--service-account-dir", in_pod(str(SERVICE_ACCOUNT_DIR), ip, mounts)]
        (self.workdir / name).mkdir(parents=True, exist_ok=True)
        process = ProxyProcess([sys.executable, str(POD_DNS), str(self.hosts), *argv], ip,
                               _http_port(container), self.workdir / name / "proxy.log",
                               pod_port(container, ADMIN_PORT_NAME), env=api_env(self.cp.port),
                               metrics_port=pod_port(container, METRICS_PORT_NAME))
        await process.start()
        self.proxies[uid] = process

    def _project(self, directory: Path, projected: dict, pod: dict, config_maps: dict[str, dict]) -> None:
        """A projected volume as the kubelet writes it: the ServiceAccount token (a TokenRequest bound
        to the pod), ConfigMap items and the pod's namespace."""
        directory.mkdir(parents=True, exist_ok=True)
        for source in projected["sources"]:
            if token := source.get("serviceAccountToken"):
                account = pod["spec"].get("serviceAccountName") or "default"
                text = self.cp.service_account_token(self.namespace, account,
                                                     token.get("expirationSeconds", 3600), pod=pod)
                project(directory / token["path"], text)
            elif ref := source.get("configMap"):
                data = config_maps[ref["name"]].get("data") or {}
                for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                    project(directory / item["path"], data[item["key"]])
            elif downward := source.get("downwardAPI"):
                for item in downward["items"]:
                    assert item["fieldRef"]["fieldPath"] == "metadata.namespace", item
                    project(directory / item["path"], self.namespace)
            else:
                raise AssertionError(f"a projected volume source this kubelet does not write: {source}")


def membership_sources(*logs: Path) -> list[str]:
    """Where a pd-proxy took each membership version it applied from, in order (its log lines
    `membership version A -> B from SOURCE: ...`)."""
    lines = [line for log in logs for line in log.read_text().splitlines()
             if "membership version " in line and " from " in line]
    return [line.split(" from ", 1)[1].split(":", 1)[0] for line in lines]


def api_env(port: int) -> dict[str, str]:
    """A container's environment: this machine's, with the API server's address as the kubelet sets
    it in every container."""
    return {**os.environ, HOST_ENV: HOST, PORT_ENV: str(port)}


def watch_pods(cp: ControlPlane, namespace: str, selector: str, handle: Callable[[str, dict], object],
               stop: threading.Event) -> None:
    """Call `handle` with each event (ADDED, MODIFIED or DELETED) and pod a watch of `namespace`
    (pods matching `selector`) shows, from a relist on, until `stop` is set (a thread's body; the
    watch is renewed every few seconds, so `stop` takes effect within them)."""
    query = urllib.parse.urlencode({"watch": "1", "timeoutSeconds": "5", "labelSelector": selector})
    request = urllib.request.Request(f"{cp.server}/api/v1/namespaces/{namespace}/pods?{query}",
                                     headers={"Authorization": f"Bearer {cp.admin_token}"})
    while not stop.is_set():
        try:
            with urllib.request.urlopen(request, context=cp.ssl_context, timeout=10) as stream:
                for line in stream:
                    if stop.is_set():
                        return
                    event = json.loads(line)
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        handle(event["type"], event["object"])
        except OSError:  # timed out or cut: the next watch lists again
            continue


def in_pod(arg: str, ip: str, mounts: dict[str, Path]) -> str:
    """A container argument as it works here: the wildcard is the pod's own address, and a path
    under a volume's mount is the same path in the pod's directory."""
    if arg == WILDCARD:
        return ip
    for mount, directory in mounts.items():
        if arg == mount or arg.startswith(mount.rstrip("/") + "/"):
            return str(directory) + arg[len(mount.rstrip("/")):]
    return arg


def project_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        project(path, text)


def project_config_map(directory: Path, config_map: dict) -> None:
    """Each key of the ConfigMap a file of `directory`, replaced atomically when it changed."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, text in (config_map.get("data") or {}).items():
        project_if_changed(directory / key, text)

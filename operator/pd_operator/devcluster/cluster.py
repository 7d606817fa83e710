"""``DevCluster``: the emulated API server running in its own thread, plus a direct store API for tests.

The server gets its own thread and event loop so that nothing the code under test does to *its*
loop (kopf's ``KopfRunner`` starts and stops loops, blocking calls of the sync ``kubernetes``
client) can stall or kill the API server. Tests talk to it over real HTTP via ``kubeconfig_path``
and may read/seed state through the thread-safe direct methods, which bypass HTTP (and faults).

The aiohttp ``RawTestServer`` is used directly rather than ``kmock.Server``: the latter also
patches ``aiohttp.TCPConnector._resolve_host`` process-wide, which would leak into the client
code under test and breaks when two clusters in different threads exit out of order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import pathlib
import tempfile
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import aiohttp.test_utils
import kmock
import yaml

from . import patching
from .faults import FaultInjector
from .records import RequestLog
from .server import ApiHandler
from .store import Obj, Store
from .workloads import WorkloadControllers, pod_failure, pod_readiness

START_TIMEOUT_S = 10.0


class DevCluster:
    def __init__(self, crd_paths: Iterable[str] = (), namespaces: Iterable[str] = ("default",)) -> None:
        self.store = Store()
        self.faults = FaultInjector()
        self.requests = RequestLog()
        self.handler = ApiHandler(store=self.store, faults=self.faults, log=self.requests)
        self.url = ""
        self.kubeconfig_path = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._workloads: concurrent.futures.Future[None] | None = None
        for namespace in namespaces:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for path in crd_paths:
            for doc in yaml.safe_load_all(pathlib.Path(path).read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    self.register_crd(doc)

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> DevCluster:
        started: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="devcluster", daemon=True)
        self._thread.start()
        self.url = started.result(timeout=START_TIMEOUT_S)
        self._tmpdir = tempfile.TemporaryDirectory(prefix="devcluster-")
        self.kubeconfig_path = str(pathlib.Path(self._tmpdir.name) / "kubeconfig")
        pathlib.Path(self.kubeconfig_path).write_text(yaml.safe_dump(self.kubeconfig()))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
        self._loop = self._thread = self._stopped = self._tmpdir = self._workloads = None

    def _run(self, started: concurrent.futures.Future[str]) -> None:
        try:
            asyncio.run(self._serve(started))
        except BaseException as e:
            if not started.done():
                started.set_exception(e)
            raise

    async def _serve(self, started: concurrent.futures.Future[str]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        async with self.handler, aiohttp.test_utils.RawTestServer(self.handler, host="127.0.0.1") as server:
            started.set_result(f"http://127.0.0.1:{server.port}")
            await self._stopped.wait()
            if self._workloads is not None:
                self._workloads.cancel()
            self.store.close_all()  # end open watch streams so the server can shut down promptly

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig with no auth and TLS verification off, pointing at this cluster."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [
                {"name": "devcluster", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}
            ],
            "users": [{"name": "devcluster", "user": {"token": "devcluster"}}],
            "contexts": [
                {
                    "name": "devcluster",
                    "context": {"cluster": "devcluster", "user": "devcluster", "namespace": "default"},
                }
            ],
            "current-context": "devcluster",
        }

    # -- direct store access (thread-safe, no HTTP, no faults) -------------------------------------

    def register_crd(self, crd: Obj) -> Obj:
        """Create a CustomResourceDefinition: discovery, CRUD, watch and /status then work for it."""
        return self.create(crd)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        rt = self.store.find_type(api_version, kind)
        try:
            return self.store.get(rt, namespace, name)
        except kmock.KubernetesError as e:
            if e.status == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[Obj]:
        return self.store.list(self.store.find_type(api_version, kind), namespace, label_selector)[0]

    def create(self, obj: Obj) -> Obj:
        """Create as-is, *including* ``.status`` (HTTP creates drop it), to seed test state."""
        rt = self.store.find_type(obj["apiVersion"], obj["kind"])
        return self.store.create(rt, obj.get("metadata", {}).get("namespace"), obj, keep_status=True)

    def patch_status(
        self, api_version: str, kind: str, namespace: str | None, name: str, status: dict[str, Any]
    ) -> Obj:
        """Merge-patch ``.status`` (as a controller writing to /status would)."""
        rt = self.store.find_type(api_version, kind)
        subresource = "status" if rt.has_status else None
        return self.store.patch(
            rt, namespace, name, patching.MERGE_PATCH, {"status": status}, subresource=subresource
        )[0]

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        """Delete with background propagation: finalizers are honoured, dependents collected."""
        return self.store.delete(self.store.find_type(api_version, kind), namespace, name)

    def break_watches(self) -> int:
        """End every open watch stream; clients see a normal EOF and re-watch. Returns how many."""
        return self.store.break_watches()

    # -- emulated kube-controller-manager -----------------------------------------------------------

    def run_workload_controllers(self, pod_ready: bool = True) -> None:
        """Start the StatefulSet/Deployment emulation (see ``workloads.py``) on the server's loop."""
        if self._loop is None:
            raise RuntimeError("start the cluster (`with DevCluster() as cluster:`) first")
        if self._workloads is None:
            controllers = WorkloadControllers(self.store, pod_ready=pod_ready)
            self._workloads = asyncio.run_coroutine_threadsafe(controllers.run(), self._loop)

    def set_pod_ready(self, namespace: str, name: str, ready: bool, container: str | None = None) -> Obj:
        """All containers of the pod (or only `container`) (not) ready, as probes would report."""
        pod = self._pod(namespace, name)
        return self.patch_status("v1", "Pod", namespace, name, pod_readiness(pod, ready, container))

    def fail_pod(self, namespace: str, name: str) -> Obj:
        pod = self._pod(namespace, name)
        return self.patch_status("v1", "Pod", namespace, name, pod_failure(pod))

    def _pod(self, namespace: str, name: str) -> Obj:
        pod = self.get("v1", "Pod", namespace, name)
        if pod is None:
            raise KeyError(f"pod {namespace}/{name} not found")
        return pod

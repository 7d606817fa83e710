"""A custom metrics API server the test controls, registered in the real kube-apiserver.

It plays the part prometheus-adapter plays in a cluster: `custom.metrics.k8s.io/v1beta2`, answering
`pods/<metric>` for a namespace and a label selector with the values the test set, one per pod the
selector matches (it lists them from the API server, as an adapter finds them in Prometheus).

    with MetricsAPI(cp) as metrics:                 # HTTPS on loopback, APIService Available
        metrics.set(namespace, "vllm_kv_cache_usage_perc", 0.9)
        cp.api("GET", metrics.path(namespace, "vllm_kv_cache_usage_perc", "app=x"))
        metrics.requests                            # (user, metric, selector) as asked

How kube-apiserver reaches it here: the APIService names a Service of type ExternalName whose
externalName is 127.0.0.1. The aggregator resolves an ExternalName Service to `externalName:port`
and dials it (k8s.io/apiserver: pkg/util/proxy/proxy.go ResolveCluster @ v0.36.3), and its
availability check looks for endpoints only behind ClusterIP Services (k8s.io/kube-aggregator:
pkg/controllers/status/remote/remote_available_controller.go @ v0.36.3). An EndpointSlice with
--enable-aggregator-routing would not do: endpoint addresses may not be loopback. The aggregator
checks the server's certificate for `<service>.<namespace>.svc` against the APIService's caBundle
and presents the front-proxy client certificate (cluster.py); this server requires that
certificate, as a real adapter's delegated authentication does, and reads the user from
X-Remote-User.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support.cluster import HOST, ApiError, ControlPlane, pick_port, wait_for

GROUP = "custom.metrics.k8s.io"
VERSION = "v1beta2"
APISERVICE = f"{VERSION}.{GROUP}"
NAMESPACE = "kube-system"
SERVICE = "pd-test-custom-metrics"
WINDOW_SECONDS = 60


@dataclass(frozen=True)
class Asked:
    """One metric request as this server received it through the aggregator."""

    user: str
    namespace: str
    metric: str
    selector: str


def _quantity(value: float) -> str:
    return f"{round(value * 1000)}m"


class MetricsAPI:
    def __init__(self, cp: ControlPlane, metrics: tuple[str, ...] = ()) -> None:
        self.cp = cp
        self.metrics = list(metrics)
        """Metric names listed in discovery (any name set() is also answered)."""
        self._values: dict[tuple[str, str], float] = {}
        self._per_pod: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self.requests: list[Asked] = []
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    # -- what the test controls ---------------------------------------------------------------

    def set(self, namespace: str, metric: str, value: float, pods: Mapping[str, float] | None = None) -> None:
        """Every pod of `namespace` reads `value` for `metric` (a pod in `pods` its own value)."""
        with self._lock:
            self._values[(namespace, metric)] = value
            for pod, own in (pods or {}).items():
                self._per_pod[(namespace, metric, pod)] = own
            if metric not in self.metrics:
                self.metrics.append(metric)

    def asked(self, metric: str, namespace: str | None = None) -> list[Asked]:
        with self._lock:
            return [a for a in self.requests
                    if a.metric == metric and (namespace is None or a.namespace == namespace)]

    @staticmethod
    def path(namespace: str, metric: str, selector: str) -> str:
        query = urllib.parse.urlencode({"labelSelector": selector})
        return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/pods/*/{metric}?{query}"

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> MetricsAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> MetricsAPI:
        assert self.cp.ca is not None, "start the control plane first"
        serving = self.cp.ca.serving("custom-metrics", [f"{SERVICE}.{NAMESPACE}.svc", HOST])
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.cp.front_proxy_ca.cert))
        context.load_cert_chain(serving.cert, serving.key)
        context.verify_mode = ssl.CERT_REQUIRED
        self.port = pick_port()
        self._server = ThreadingHTTPServer((HOST, self.port), _handler(self))
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, name="metrics-api", daemon=True).start()
        try:
            self._register()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for path in (f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}",
                     f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}"):
            try:
                self.cp.api("DELETE", path)
            except ApiError as err:
                if err.status != 404:
                    raise
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _register(self) -> None:
        self.cp.api("POST", f"/api/v1/namespaces/{NAMESPACE}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE},
            "spec": {"type": "ExternalName", "externalName": HOST,
                     "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}]}})
        self.cp.api("POST", "/apis/apiregistration.k8s.io/v1/apiservices", {
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
            "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 100, "versionPriority": 200,
                     "service": {"namespace": NAMESPACE, "name": SERVICE, "port": self.port},
                     "caBundle": _b64(self.cp.ca_pem)}})

        def available() -> bool:
            status = self.cp.api("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
            return any(c["type"] == "Available" and c["status"] == "True"
                       for c in status.get("status", {}).get("conditions", []))

        wait_for(f"APIService {APISERVICE} Available", available, timeout=120)

    # -- answers ---------------------------------------------------------------------------------

    def discovery(self) -> dict[str, Any]:
        with self._lock:
            names = list(self.metrics)
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}",
                "resources": [{"name": f"pods/{m}", "singularName": "", "namespaced": True,
                               "kind": "MetricValueList", "verbs": ["get"]} for m in names]}

    def values(self, user: str, namespace: str, metric: str, selector: str) -> dict[str, Any] | None:
        """The MetricValueList for the pods `selector` matches; None for a metric never set."""
        with self._lock:
            self.requests.append(Asked(user, namespace, metric, selector))
            value = self._values.get((namespace, metric))
            per_pod = {pod: v for (ns, m, pod), v in self._per_pod.items() if ns == namespace and m == metric}
        if value is None:
            return None
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        pods = self.cp.api("GET", f"/api/v1/namespaces/{namespace}/pods{query}")["items"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        items = [{"describedObject": {"kind": "Pod", "namespace": namespace, "name": p["metadata"]["name"],
                                      "apiVersion": "/v1"},
                  "metric": {"name": metric}, "timestamp": now, "windowSeconds": WINDOW_SECONDS,
                  "value": _quantity(per_pod.get(p["metadata"]["name"], value))}
                 for p in pods if not p["metadata"].get("deletionTimestamp")]
        return {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{VERSION}", "metadata": {}, "items": items}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _handler(api: MetricsAPI) -> type[BaseHTTPRequestHandler]:
    prefix = f"/apis/{GROUP}/{VERSION}"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _not_found(self, what: str) -> None:
            self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                             "code": 404, "message": f"{what} not found"})

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path).rstrip("/")  # clients send `*` as %2A
            if path == prefix:
                self._send(200, api.discovery())
                return
            # /apis/custom.metrics.k8s.io/v1beta2/namespaces/NS/pods/NAME-OR-*/METRIC
            parts = path.removeprefix(prefix).strip("/").split("/")
            if path.startswith(prefix + "/") and len(parts) == 5 and parts[0] == "namespaces" \
                    and parts[2] == "pods":
                selector = urllib.parse.parse_qs(url.query).get("labelSelector", [""])[0]
                user = self.headers.get("X-Remote-User", "")
                answer = api.values(user, parts[1], parts[4], selector)
                if answer is not None and parts[3] != "*":
                    answer["items"] = [i for i in answer["items"] if i["describedObject"]["name"] == parts[3]]
                if answer is None:
                    self._not_found(f"metric {parts[4]}")
                else:
                    self._send(200, answer)
                return
            # Everything else, /apis (aggregated discovery) included: the aggregator falls back
            # to this group version's legacy discovery document.
            self._not_found(self.path)

    return Handler

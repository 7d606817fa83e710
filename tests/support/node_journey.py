"""The README's journey on the real node (support/node.py), for the `node` tier and `make demo`: the
operator from its image through the chart, an example applied unmodified, its pods run by the kubelet in
containerd from the images it names (the images tier's: the operator image, the stock-serving stand-in
whose `vllm` serves and moves KV over Mooncake, support/serving_standin.py), a completion through
pd-proxy and the KV bytes decode verified.

    images = import_images(cluster)                    # built by the images tier when missing
    release = install(cluster, workdir)                # helm install; the operator's pod Ready
    deployment = apply_example(cluster, path, ns)      # api-key Secret, weights claim, kubectl apply
    wait_ready(cluster, deployment)
    answer = complete(cluster, deployment, "hello")    # through pd-proxy at its pod's IP
    verified(cluster, deployment, answer.request_id)   # decode's `kv verified` log line of it
"""

from __future__ import annotations

import json
import pathlib
import secrets
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

import yaml

from pd_operator.api.labels import DEPLOYMENT, ROLE
from support import containers
from support.cluster import wait_for
from support.installed import Release, helm_install, is_ready, wait_webhook_called, weights_claim
from support.kube import kubectl
from support.node import NodeCluster
from support.specs import EXAMPLES, example

CHART_IMAGE = "ghcr.io/pd-serving/pd-operator:0.1.0"
"""The image the chart names by default (its appVersion), which the rendered pd-tools and proxy
containers name too: the operator image built by the images tier, imported under that name."""
READY_TIMEOUT_S = 600.0
"""Until a deployment is Ready: its prefill's probes (10 s periods), the proxy's membership ConfigMap
projected into the decode pods at the kubelet's sync (up to a minute and more), the gate's round (30 s)."""
VERIFIED = "kv verified: "


def serving_images() -> dict[str, tuple]:
    """Every serving image the examples name -> the images tier's stand-in that plays it (the seed
    change's when the example claims it, as tests/images/test_rendered_pods.py runs them)."""
    images = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        image = yaml.safe_load(path.read_text())["spec"]["image"]
        seed = image.get("seedChange")
        images[image["name"]] = containers.SEED_SERVING if seed else containers.STOCK_SERVING
    return images


def import_images(cluster: NodeCluster) -> list[str]:
    """The operator image as the chart's, and the stand-ins under every serving image name the examples
    use, into the node's containerd (each built by the images tier first, seconds when warm)."""
    specs = {containers.OPERATOR[0]: containers.OPERATOR}
    wanted: dict[str, list[str]] = {containers.OPERATOR[0]: [CHART_IMAGE]}
    for name, standin in serving_images().items():
        specs[standin[0]] = standin
        wanted.setdefault(standin[0], []).append(name)
    for local, names in wanted.items():
        image = containers.build(*specs[local])
        if not set(names) <= set(cluster.node.images()):  # imported earlier in this node's life
            cluster.node.import_podman_image(image, *names)
    return [name for names in wanted.values() for name in names]


def ready_pod(cluster: NodeCluster, namespace: str, selector: str = "") -> dict | None:
    pods = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")["items"]
    return next((p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p["status"].get("conditions", []))), None)


def install(cluster: NodeCluster, workdir: pathlib.Path) -> Release:
    """`helm install` of the chart; returns once the operator's pod is Ready by its probe."""
    release = helm_install(cluster, workdir)
    wait_for("the operator's pod Ready by its probe", lambda: ready_pod(cluster, release.namespace),
             timeout=240, alive=cluster.node.components.values())
    return release


@dataclass(frozen=True)
class Deployment:
    namespace: str
    name: str
    api_key: str
    doc: dict


def apply_example(cluster: NodeCluster, path: pathlib.Path, namespace: str) -> Deployment:
    """What the example's comments say to create first (the API key Secret, the weights claim, here
    bound to a local volume of the node), then `kubectl apply` of the example in `namespace` (created
    when missing)."""
    doc = example(path, namespace)
    cluster.create_namespace(namespace)
    wait_webhook_called(cluster, namespace, timeout=120)  # the API server has loaded its configuration
    key = secrets.token_hex(24)
    secret = doc["spec"]["proxy"]["apiKey"]["name"]
    kubectl(cluster.kubeconfig, "create", "secret", "generic", secret, "-n", namespace,
            f"--from-literal=api-key={key}")
    if claim := weights_claim(doc):
        cluster.create_weights_volume(namespace, claim)
    kubectl(cluster.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc))
    return Deployment(namespace, doc["metadata"]["name"], key, doc)


def wait_ready(cluster: NodeCluster, deployment: Deployment, timeout: float = READY_TIMEOUT_S) -> None:
    wait_for(f"{deployment.namespace}/{deployment.name} Ready",
             lambda: is_ready(cluster, deployment.namespace, deployment.name), timeout, interval=1,
             alive=cluster.node.components.values())


def pods(cluster: NodeCluster, deployment: Deployment, role: str | None = None) -> list[dict]:
    selector = f"{DEPLOYMENT}={deployment.name}" + (f",{ROLE}={role}" if role else "")
    path = f"/api/v1/namespaces/{deployment.namespace}/pods?labelSelector={selector}"
    return list(cluster.api("GET", path)["items"])


def proxy_url(cluster: NodeCluster, deployment: Deployment) -> str:
    """pd-proxy at its Ready pod's IP (no kube-proxy here: its Service's ClusterIP does not route)."""
    selector = f"{DEPLOYMENT}={deployment.name},{ROLE}=proxy"
    pod = wait_for("a Ready pd-proxy pod", lambda: ready_pod(cluster, deployment.namespace, selector), 60)
    (port,) = [p["containerPort"] for p in pod["spec"]["containers"][0]["ports"] if p.get("name") == "http"]
    return f"http://{pod['status']['podIP']}:{port}"


@dataclass(frozen=True)
class Answer:
    request_id: str
    status: int
    body: dict


def complete(cluster: NodeCluster, deployment: Deployment, prompt: str, url: str | None = None,
             max_tokens: int = 8) -> Answer:
    """POST /v1/completions through pd-proxy, as a client with the deployment's API key."""
    request_id = f"journey-{secrets.token_hex(6)}"
    model = deployment.doc["spec"]["model"].get("servedModelName") or deployment.doc["spec"]["model"]["name"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request((url or proxy_url(cluster, deployment)) + "/v1/completions", body, {
        "Content-Type": "application/json", "Authorization": f"Bearer {deployment.api_key}",
        "X-Request-Id": request_id})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return Answer(request_id, answer.status, json.loads(answer.read()))
    except urllib.error.HTTPError as err:
        return Answer(request_id, err.code, {"error": err.read().decode(errors="replace")})


def verified(cluster: NodeCluster, deployment: Deployment, request_id: str) -> dict | None:
    """The `kv verified` record a decode engine logged for the request (kubectl logs through the
    kubelet), None when no decode pod logged one."""
    for pod in pods(cluster, deployment, "decode"):
        logs = kubectl(cluster.kubeconfig, "logs", "-n", deployment.namespace, pod["metadata"]["name"],
                       "-c", "vllm", check=False).stdout
        for line in logs.splitlines():
            if line.startswith(VERIFIED):
                record = json.loads(line[len(VERIFIED):])
                if record.get("request") == request_id:
                    return {**record, "pod": pod["metadata"]["name"]}
    return None


def remove(cluster: NodeCluster, deployment: Deployment) -> None:
    """`kubectl delete pdd` while the operator runs (its finalizer), then the namespace unless it is
    `default`: the node's NPUs and containers are free again."""
    kubectl(cluster.kubeconfig, "delete", "pdd", deployment.name, "-n", deployment.namespace, "--wait=true",
            "--timeout=180s", check=False, timeout=240)
    if deployment.namespace != "default":
        cluster.delete_namespace(deployment.namespace)


class Load:
    """Completions through pd-proxy from `clients` threads, each sending the next as soon as its last is
    answered, until `stop()`: each answer's status is kept (`failed()` lists what was not a 200) and
    `in_flight` counts the requests sent and not yet answered. `prompt`'s bytes are its tokens to the
    stand-in `vllm` (serving_standin.MAX_PROMPT_TOKENS at most), whose KV decode pulls from prefill."""

    def __init__(self, cluster: NodeCluster, deployment: Deployment, clients: int = 1,
                 prompt: str = "load") -> None:
        self.cluster, self.deployment, self.prompt = cluster, deployment, prompt
        self.url = proxy_url(cluster, deployment)
        self.answers: list[Answer] = []
        self.in_flight = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.in_flight += 1
            try:
                answer = complete(self.cluster, self.deployment, self.prompt, self.url, max_tokens=2)
            except OSError as err:  # refused, reset, timed out: a failed request too
                answer = Answer("", 0, {"error": f"{type(err).__name__}: {err}"})
            with self._lock:
                self.in_flight -= 1
                self.answers.append(answer)
            if answer.status != 200:
                self._stop.wait(0.1)  # a client backing off: failures come back at once

    def failed(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]

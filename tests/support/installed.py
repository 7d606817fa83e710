"""The operator as users install it: `helm install` of charts/pd-operator, then the operator process
with the chart's own command and arguments, authenticated only as the chart's ServiceAccount.

    release = helm_install(cp, workdir)                  # the real chart, into pd-system
    with release.operator(cp, workdir) as op:            # `pd-operator run <the chart's args>`
        op.wait_health(lambda h: h["webhook"]["ok"])     # /healthz, kopf probes (webhook state)
        ...
        op.kill()                                        # SIGKILL, for crash tests

The Deployment the chart creates runs on a kwok node, where nothing executes; the real process
runs here (or in the operator image: `release.operator_container(cp, workdir, image)`, the
`images` tier) with POD_IP=127.0.0.1 (what the downward API would give it), so the API server calls
its webhook on loopback. Its health, metrics and webhook ports are moved to free ones (the
chart's fixed 8080/9090/9443 may be taken on a shared machine); every other argument is the chart's.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from pd_operator.api.types import GROUP, PLURAL, VERSION
from support import containers
from support.cluster import HOST, ApiError, Component, ControlPlane, pick_port, service_account_user, wait_for
from support.kube import CHART, helm, kubectl
from support.specs import example

PORT_FLAGS = ("--health-port=", "--metrics-port=", "--webhook-port=")
RELEASE = "pd-operator"
NAMESPACE = "pd-system"


def _flag(args: Sequence[str], prefix: str) -> str | None:
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)


def local_ports(args: Sequence[str]) -> list[str]:
    """The same arguments with health, metrics and webhook on free loopback ports."""
    return [f"{p}{pick_port()}" if (p := next((f for f in PORT_FLAGS if a.startswith(f)), None)) else a
            for a in args]


class OperatorProcess(Component):
    """`pd-operator <args>` in its own process, its output in `log`."""

    def __init__(self, argv: list[str], env: dict[str, str], log: pathlib.Path) -> None:
        super().__init__("pd-operator", argv, log, env)
        port = _flag(argv, "--health-port=")
        self.health_url = f"http://127.0.0.1:{port}/healthz" if port else None
        metrics = _flag(argv, "--metrics-port=")
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics" if metrics else None

    def __enter__(self) -> OperatorProcess:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def health(self) -> dict[str, Any]:
        assert self.health_url, "no --health-port"
        with urllib.request.urlopen(self.health_url, timeout=5) as response:
            return dict(json.load(response))

    def metric(self, metric: str, **labels: str) -> float:
        """The sum of a metric's samples (Prometheus text) whose labels include `labels`."""
        assert self.metrics_url, "no --metrics-port"
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            text = response.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def writes_when_settled(self, cp: ControlPlane, user: str, namespace: str, resource: str | None = None,
                            timeout: float = 180) -> list[str]:
        """Every write by `user` in `namespace` (to `resource`, if given) across two drift reconciles.
        The mark is taken after a first drift reconcile has ended: reconciles of an object run one at
        a time, so whatever one in flight still wrote after the state a test waited for (the event
        after a status patch, the status after a prune) lands before the mark."""
        def drifts() -> float:
            return self.metric("pd_operator_reconcile_total", trigger="drift")
        first = drifts()
        wait_for("a drift reconcile", lambda: drifts() > first, timeout)
        mark = cp.audit.mark()
        before = drifts()
        wait_for("two drift reconciles", lambda: drifts() >= before + 2, timeout)
        return [str(e) for e in cp.audit.events(mark, user=user, namespace=namespace, resource=resource)
                if e.write]

    def wait_health(self, check: Callable[[dict[str, Any]], bool], what: str = "operator health",
                    timeout: float = 120) -> dict[str, Any]:
        """Wait until /healthz answers and `check` accepts it (fails at once if the process exits)."""
        def ok() -> tuple[dict[str, Any]] | None:  # a tuple: an operator with no probes answers {}
            if not self.running():
                raise AssertionError(f"the operator exited ({self.process and self.process.returncode}):\n"
                                     f"{self.output()[-3000:]}")
            health = self.health()
            return (health,) if check(health) else None
        return dict(wait_for(what, ok, timeout)[0])


class OperatorContainer(containers.InContainer, OperatorProcess):
    """The operator in its image: `podman run` in the foreground, so stop() is the kubelet's SIGTERM
    (podman passes it on) and kill() a crash; either removes the container."""

    def __init__(self, argv: list[str], env: dict[str, str], log: pathlib.Path, container: str) -> None:
        self.container = container
        super().__init__(argv, env, log)


# Where a kubelet projects a pod's ServiceAccount token (its automounted `kube-api-access-*` volume).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class Release:
    """An installed chart: what it rendered and who its operator is."""

    name: str
    namespace: str
    manifest: list[dict]

    def find(self, kind: str) -> list[dict]:
        return [d for d in self.manifest if d.get("kind") == kind]

    @property
    def container(self) -> dict:
        (deployment,) = self.find("Deployment")
        containers = deployment["spec"]["template"]["spec"]["containers"]
        (container,) = [c for c in containers if c["name"] == "operator"]
        return dict(container)

    @property
    def service_account(self) -> str:
        (deployment,) = self.find("Deployment")
        return str(deployment["spec"]["template"]["spec"]["serviceAccountName"])

    @property
    def user(self) -> str:
        """The operator's user name in the API server's audit log."""
        return service_account_user(self.namespace, self.service_account)

    def operator(self, cp: ControlPlane, workdir: pathlib.Path, *, server: str | None = None,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None) -> OperatorProcess:
        """The chart's operator command with a TokenRequest kubeconfig of the chart's ServiceAccount
        (through `server`, e.g. a FaultProxy URL, when given); not started yet."""
        path = workdir / f"{self.service_account}.kubeconfig"
        kubeconfig = cp.service_account_kubeconfig(self.namespace, self.service_account, path, server=server)
        command = self.container["command"]
        # The image's `pd-operator` is the console script installed beside this interpreter.
        program = pathlib.Path(sys.executable).parent / command[0]
        argv = [str(program), *command[1:], *local_ports(self.container["args"]), *extra_args,
                f"--kubeconfig={kubeconfig}"]
        return OperatorProcess(argv, {**os.environ, "POD_IP": "127.0.0.1", "POD_NAMESPACE": self.namespace,
                                      "POD_ID": f"{self.name}-local", **(env or {})},
                               workdir / "operator.log")

    def operator_container(self, cp: ControlPlane, workdir: pathlib.Path, image: str, *,
                           extra_args: Sequence[str] = ()) -> OperatorContainer:
        """The chart's operator container run as a kubelet would run it, in `image` (support.containers):
        the chart's command, args, env and securityContext (read-only root, its user, capabilities
        dropped, no privilege escalation), its emptyDir as a tmpfs, and the ServiceAccount's token,
        CA and namespace where a pod finds them, with KUBERNETES_SERVICE_HOST/PORT (in-cluster
        config, no kubeconfig). On the host's network: the API server on loopback is the service,
        and it calls the webhook at POD_IP=127.0.0.1. Not started yet."""
        (deployment,) = self.find("Deployment")
        pod = deployment["spec"]["template"]["spec"]
        token = workdir / "serviceaccount"
        token.mkdir(mode=0o755, exist_ok=True)
        for name, text in (("token", cp.service_account_token(self.namespace, self.service_account)),
                           ("ca.crt", cp.ca_pem.decode()), ("namespace", self.namespace)):
            (token / name).write_text(text)
        name = containers.container_name(f"{self.name}-operator")
        fields = {"metadata.name": name, "metadata.namespace": self.namespace, "status.podIP": "127.0.0.1"}
        options = ["--network=host",
                   *containers.security_options(pod, self.container),
                   *containers.env_options(self.container, fields),
                   *containers.volume_options(pod, self.container, {}),
                   "--volume", f"{token}:{SERVICE_ACCOUNT_DIR}:ro",
                   "--env", f"KUBERNETES_SERVICE_HOST={HOST}",
                   "--env", f"KUBERNETES_SERVICE_PORT={cp.port}",
                   "--entrypoint", self.container["command"][0]]
        command = [*self.container["command"][1:], *local_ports(self.container["args"]), *extra_args]
        argv = containers.run_argv(image, command, options=options, name=name)
        return OperatorContainer(argv, containers.environment(), workdir / "operator-container.log", name)


def weights_claim(doc: dict) -> str | None:
    """The PersistentVolumeClaim a PDDeployment's model weights come from, if any."""
    claim = ((doc["spec"]["model"].get("weights") or {}).get("pvc") or {}).get("claimName")
    return str(claim) if claim else None


def get_pdd(cp: ControlPlane, namespace: str, name: str) -> dict:
    return dict(cp.api("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"))


def condition(obj: dict, kind: str) -> dict:
    """The status condition of type `kind` ({} when absent)."""
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def is_ready(cp: ControlPlane, namespace: str, name: str) -> bool:
    return condition(get_pdd(cp, namespace, name), "Ready").get("status") == "True"


def wait_webhook_called(cp: ControlPlane, namespace: str, timeout: float = 60) -> None:
    """Wait until the API server calls the webhook the operator just configured (it reloads webhook
    configurations asynchronously; until then a write may still go to an older address): a
    server-side dry run of the GLM example in `namespace` is admitted."""
    doc = example(namespace=namespace)
    doc["metadata"]["name"] = "webhook-check"  # a dry run: nothing is stored, no name is taken
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}?dryRun=All"

    def admitted() -> bool:
        try:
            cp.api("POST", path, doc)
        except ApiError as err:
            if "failed calling webhook" in err.body:
                return False
            raise
        return True
    wait_for("the API server calling the webhook", admitted, timeout)


def helm_install(cp: ControlPlane, workdir: pathlib.Path, *, release: str = RELEASE,
                 namespace: str = NAMESPACE, values: Sequence[str] = ()) -> Release:
    """`helm install RELEASE charts/pd-operator -n NAMESPACE --create-namespace [--set ...]`."""
    sets = [a for v in values for a in ("--set", v)]
    helm(cp.kubeconfig, "install", release, str(CHART), "-n", namespace, "--create-namespace", *sets)
    manifest = helm(cp.kubeconfig, "get", "manifest", release, "-n", namespace).stdout
    return Release(release, namespace, [d for d in yaml.safe_load_all(manifest) if d])


def install_crds(cp: ControlPlane) -> None:
    """The chart's CRDs (charts/pd-operator/crds: the generated crds/ and kopf's peering) as `helm
    install` creates them, for objects the operator owns (PDRoles) applied without the operator; a
    later `helm install` leaves CRDs that exist alone."""
    kubectl(cp.kubeconfig, "apply", "--server-side", "-f", str(CHART / "crds"))
    kubectl(cp.kubeconfig, "wait", "--for=condition=Established", "-f", str(CHART / "crds"))


def helm_uninstall(cp: ControlPlane, release: Release) -> None:
    helm(cp.kubeconfig, "uninstall", release.name, "-n", release.namespace, check=False)

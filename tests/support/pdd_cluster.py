"""One PDDeployment (GLM by default) on the real control plane: its children, pods, conditions and the
operator's writes, and `kubectl` the way a user changes it (the controller's integration tests)."""

from __future__ import annotations

import copy
import json
import re
import urllib.parse

import yaml

from pd_operator.api.types import PLURAL
from pd_operator.render.proxy import members
from support import fleet
from support.cluster import ControlPlane, wait_for
from support.installed import condition, get_pdd, weights_claim
from support.kube import kubectl
from support.specs import ROOT, example

GLM = "glm-flash"
GLM_CHILDREN = {"PDRole/glm-flash-prefill", "PDRole/glm-flash-decode",
                "ConfigMap/glm-flash-prefill-<hash>", "ConfigMap/glm-flash-decode-<hash>",
                "ConfigMap/glm-flash-proxy",
                "Service/glm-flash-prefill-0", "Service/glm-flash-decode-0", "Service/glm-flash-proxy",
                "ServiceAccount/glm-flash-proxy", "Role/glm-flash-proxy", "RoleBinding/glm-flash-proxy",
                "StatefulSet/glm-flash-prefill-0", "StatefulSet/glm-flash-decode-0",
                "Deployment/glm-flash-proxy", "NetworkPolicy/glm-flash-kv", "NetworkPolicy/glm-flash-proxy",
                "PodDisruptionBudget/glm-flash-prefill", "PodDisruptionBudget/glm-flash-decode",
                "ConfigMap/glm-flash-last-valid-spec"}
READY_TIMEOUT_S = 180
PROXY_PATH = "/apis/apps/v1/namespaces/{}/deployments/glm-flash-proxy"
GLM_CONFIG = ROOT / "tests" / "kv" / "hf_configs" / "glm-5.3-flash" / "config.json"


def _base(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def listed(cp: ControlPlane, api_version: str, plural: str, namespace: str, selector: str = "") -> list[dict]:
    query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
    return list(cp.api("GET", f"{_base(api_version)}/namespaces/{namespace}/{plural}{query}")["items"])


def children(cp: ControlPlane, namespace: str, name: str = GLM) -> dict[str, dict]:
    """Every child of the PDDeployment `name` (GLM's by default), as Kind/name."""
    return fleet.children(cp, namespace, name)


REVISION_CONFIG = re.compile(r"(ConfigMap/.+-(?:prefill|decode))-[0-9a-f]{10}")


def refs(found: dict[str, dict]) -> set[str]:
    """The Kind/name keys of `children`, a revision config's hash written `<hash>` (GLM_CHILDREN's form)."""
    return {REVISION_CONFIG.sub(r"\1-<hash>", ref) if REVISION_CONFIG.fullmatch(ref) else ref
            for ref in found}


def pods(cp: ControlPlane, namespace: str, selector: str = "") -> list[dict]:
    return listed(cp, "v1", "pods", namespace, selector)


def routes(cp: ControlPlane, namespace: str, name: str = GLM) -> tuple[list[str], list[str]]:
    """(prefill, decode) instance names in the proxy's membership ConfigMap."""
    listed = members(cp.api("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}-proxy"))
    assert listed is not None
    return [u.name for u in listed.prefill], [u.name for u in listed.decode]


def cond(cp: ControlPlane, namespace: str, kind: str, name: str = GLM) -> tuple[str, str] | None:
    found = condition(get_pdd(cp, namespace, name), kind)
    return (found["status"], found["reason"]) if found else None


def wait_cond(cp: ControlPlane, namespace: str, kind: str, want: tuple[str, str], name: str = GLM,
              timeout: float = READY_TIMEOUT_S) -> None:
    try:
        wait_for(f"{name} {kind}={want}", lambda: cond(cp, namespace, kind, name) == want, timeout,
                 interval=0.3)
    except TimeoutError:
        status = get_pdd(cp, namespace, name).get("status", {})
        listing = kubectl(cp.kubeconfig, "get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        raise AssertionError(f"{kind} is not {want}: {json.dumps(status.get('conditions'), indent=1)}\n"
                             f"{listing}") from None


def serve(cp: ControlPlane, namespace: str, name: str = GLM) -> None:
    wait_cond(cp, namespace, "Ready", ("True", "Serving"), name)


def glm(namespace: str, doc: dict | None = None) -> dict:
    doc = copy.deepcopy(doc or example())
    doc["metadata"]["namespace"] = namespace
    return doc


def apply(cp: ControlPlane, doc: dict, check: bool = True):
    """`kubectl apply` as the cluster's admin, creating the weights volume the spec names first."""
    claim = weights_claim(doc)
    namespace = doc["metadata"]["namespace"]
    if claim and not cp.exists(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"):
        cp.create_weights_volume(namespace, claim)
    return kubectl(cp.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(doc), check=check)


def patch_spec(cp: ControlPlane, namespace: str, spec: dict, name: str = GLM, check: bool = True):
    return kubectl(cp.kubeconfig, "patch", "pdd", name, "-n", namespace, "--type=merge",
                   "-p", json.dumps({"spec": spec}), check=check)


def config_map_model(namespace: str) -> dict:
    """The GLM example with its model read from a ConfigMap: the webhook cannot judge it (it reads
    no ConfigMaps) and leaves the KV check to the controller."""
    doc = glm(namespace)
    doc["spec"]["model"].pop("preset")
    doc["spec"]["model"]["hfConfigMap"] = {"name": "glm-config"}
    return doc


def create_glm_config(cp: ControlPlane, namespace: str) -> None:
    cp.api("POST", f"/api/v1/namespaces/{namespace}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "glm-config"},
        "data": {"config.json": GLM_CONFIG.read_text()}})


def events(cp: ControlPlane, namespace: str, reason: str) -> list[dict]:
    return [e for e in listed(cp, "v1", "events", namespace) if e.get("reason") == reason]


def operator_writes(cp: ControlPlane, since: int, user: str, namespace: str, children_only: bool = False):
    writes = [e for e in cp.audit.events(since, user=user, namespace=namespace) if e.write]
    if children_only:
        writes = [e for e in writes if e.resource not in (PLURAL, f"{PLURAL}/status", "events")]
    return [str(e) for e in writes]

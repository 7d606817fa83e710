"""The only module that talks to the Kubernetes API (a proxy pod's state is read apart, in
controller/proxy_state.py).

It uses the official `kubernetes` client's ApiClient for transport (auth, TLS and kubeconfig or
in-cluster config, the same library kopf logs in with) but sends plain JSON to explicit paths:
server-side apply needs a raw `application/apply-patch+yaml` PATCH that the typed APIs do not
offer per kind, and plain dicts keep the pure diff free of client models.

Each method declares the (verb, group, resource) requests it makes with `@needs`
(controller/permissions.py), and every request is checked against its method's declaration at run
time, so the declarations cannot drift from the code.

Requests are blocking (reconciles run in threads, controller/runner.py); `concurrently` sends the
independent requests of one reconcile step (the children's applies, their existence checks) at once
instead of one round trip after another, which is most of a fresh object's reconcile time.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

import kubernetes
import urllib3

from pd_operator.api.types import API_VERSION, GROUP, PLURAL, ROLE_PLURAL, VERSION
from pd_operator.controller.permissions import children_needs, current_needs, needs
from pd_operator.render.kinds import api_group, resource_of

FIELD_MANAGER = "pd-operator"
TIMEOUT_S = 30
REQUESTS_IN_FLIGHT = 16
"""At most this many of `concurrently`'s requests at once, over all reconciles (kube-apiserver's own
default limit is 400 mutating and non-mutating requests in flight)."""
CONNECTIONS = 32
"""Kept-alive connections to the API server: `concurrently`'s plus the reconcile threads' own
(controller/runner.py RECONCILE_WORKERS), so none is opened and dropped per request (the client's
default, 5 per core, is fewer)."""

T = TypeVar("T")
R = TypeVar("R")
_requests = concurrent.futures.ThreadPoolExecutor(REQUESTS_IN_FLIGHT, thread_name_prefix="api-request")


def concurrently(call: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """`call(item)` for every item at once (blocking calls of this client: each in a thread of its
    own); the results in the items' order. Every call runs to its end; then the first error, in the
    items' order, is raised."""
    todo = list(items)
    if len(todo) < 2:
        return [call(item) for item in todo]
    futures = [_requests.submit(call, item) for item in todo]
    concurrent.futures.wait(futures)
    for future in futures:
        if (error := future.exception()) is not None:
            raise error
    return [future.result() for future in futures]


class ApiError(Exception):
    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def temporary(self) -> bool:
        """Conflicts, throttling, server errors and lost connections are worth a retry."""
        return self.status is None or self.status in (409, 429) or self.status >= 500


class NotServed(ApiError):
    """The API server does not serve a child's kind (its API group is off or its CRD is missing), so
    the child cannot be applied; `manifest` is the child."""

    def __init__(self, message: str, manifest: dict) -> None:
        super().__init__(404, message)
        self.manifest = manifest


def _path(api_version: str, plural: str, namespace: str, name: str | None = None,
          sub: str | None = None) -> str:
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return "/".join(p for p in (f"{root}/namespaces/{namespace}/{plural}", name, sub) if p)


class Client:
    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api

    def _request(self, verb: str, api_version: str, plural: str, method: str, path: str, *,
                 query: list[tuple[str, str]] | None = None, body: Any = None,
                 content_type: str = "application/json") -> Any:
        """The JSON answer."""
        allowed = current_needs()
        need = (verb, api_group(api_version), plural)
        if need not in allowed:
            raise RuntimeError(f"undeclared API request {need}: add it to the method's @needs")
        try:
            method, url, headers, payload, _ = self.api.param_serialize(
                method, path, query_params=query or [], body=body, auth_settings=["BearerToken"],
                header_params={"Content-Type": content_type, "Accept": "application/json"})
            response = self.api.call_api(method, url, headers, payload, _request_timeout=TIMEOUT_S)
            response.read()
        except kubernetes.client.ApiException as err:
            raise ApiError(err.status, _message(err.body, str(err.reason))) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise ApiError(None, f"{method} {path}: {err}") from None
        data = response.data.decode() if response.data else ""
        if not 200 <= response.status < 300:
            raise ApiError(response.status, _message(data, f"{method} {path}: HTTP {response.status}"))
        return json.loads(data) if data else None

    # -- PDDeployments ------------------------------------------------------------------------------

    @needs(("get", GROUP, PLURAL))
    def get_pddeployment(self, namespace: str, name: str) -> dict | None:
        try:
            return self._request("get", f"{GROUP}/{VERSION}", PLURAL, "GET",
                                 _path(f"{GROUP}/{VERSION}", PLURAL, namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    @needs(("patch", GROUP, f"{PLURAL}/status"))
    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        """Merge-patch through the status subresource (lists such as conditions are replaced)."""
        self._request("patch", f"{GROUP}/{VERSION}", f"{PLURAL}/status", "PATCH",
                      _path(f"{GROUP}/{VERSION}", PLURAL, namespace, name, "status"),
                      body={"status": status}, content_type="application/merge-patch+json")

    # -- children -----------------------------------------------------------------------------------

    @needs(*children_needs("patch", "create"))  # an apply that creates the object is authorised as create too
    def apply(self, manifest: dict) -> dict:
        """Server-side apply with the operator's one field manager, taking over conflicting fields."""
        meta = manifest["metadata"]
        plural = resource_of(manifest)
        try:
            result: dict = self._request(
                "patch", manifest["apiVersion"], plural, "PATCH",
                _path(manifest["apiVersion"], plural, meta["namespace"], meta["name"]),
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")], body=manifest,
                content_type="application/apply-patch+yaml")
        except ApiError as err:
            # An apply creates a missing object, so 404 means the resource type itself is unknown
            # (the namespace exists: the PDDeployment lives in it).
            if err.status == 404:
                raise NotServed(str(err), manifest) from None
            raise
        return result

    @needs(*children_needs("get"))
    def get_child(self, manifest: dict) -> dict | None:
        """The object of `manifest`'s kind and name as it is now, or None when there is none."""
        meta = manifest["metadata"]
        plural = resource_of(manifest)
        try:
            path = _path(manifest["apiVersion"], plural, meta["namespace"], meta["name"])
            found: dict = self._request("get", manifest["apiVersion"], plural, "GET", path)
        except ApiError as err:
            if err.status == 404:  # no such object (or the kind is not served: the apply says which)
                return None
            raise
        return found

    @needs(("create", GROUP, ROLE_PLURAL))
    def create_role(self, manifest: dict) -> dict:
        """Create a PDRole with its spec.replicas (a create, not an apply: the operator's apply never
        owns that field, see controller/pdroles.py)."""
        meta = manifest["metadata"]
        try:
            result: dict = self._request(
                "create", API_VERSION, ROLE_PLURAL, "POST",
                _path(API_VERSION, ROLE_PLURAL, meta["namespace"]),
                query=[("fieldManager", FIELD_MANAGER)], body=manifest)
        except ApiError as err:
            if err.status == 404:  # the namespace exists, so the PDRole CRD is missing
                raise NotServed(str(err), manifest) from None
            raise
        return result

    @needs(("patch", GROUP, ROLE_PLURAL))
    def forward_replicas(self, namespace: str, name: str, patch: dict) -> dict:
        """Merge-patch a PDRole's spec.replicas and forwarded-replicas annotation (controller/pdroles.py)."""
        result: dict = self._request("patch", API_VERSION, ROLE_PLURAL, "PATCH",
                                     _path(API_VERSION, ROLE_PLURAL, namespace, name),
                                     query=[("fieldManager", FIELD_MANAGER)], body=patch,
                                     content_type="application/merge-patch+json")
        return result

    @needs(("patch", GROUP, f"{ROLE_PLURAL}/status"))
    def patch_role_status(self, namespace: str, name: str, status: dict) -> dict:
        """Merge-patch a PDRole's status (the scale subresource reads replicas and selector there)."""
        result: dict = self._request("patch", API_VERSION, f"{ROLE_PLURAL}/status", "PATCH",
                                     _path(API_VERSION, ROLE_PLURAL, namespace, name, "status"),
                                     query=[("fieldManager", FIELD_MANAGER)], body={"status": status},
                                     content_type="application/merge-patch+json")
        return result

    @needs(*children_needs("delete"))
    def delete(self, obj: dict) -> None:
        """Delete one child; the API server's garbage collector removes what it owns (its pods)."""
        meta = obj["metadata"]
        try:
            self._request("delete", obj["apiVersion"], resource_of(obj), "DELETE",
                          _path(obj["apiVersion"], resource_of(obj), meta["namespace"], meta["name"]),
                          body={"preconditions": {"uid": meta["uid"]}, "propagationPolicy": "Background"})
        except ApiError as err:
            if err.status != 404:
                raise

    @needs(("patch", "apps", "statefulsets"))
    def annotate_stateful_set(self, namespace: str, name: str, annotations: dict[str, str]) -> dict:
        result: dict = self._request("patch", "apps/v1", "statefulsets", "PATCH",
                      _path("apps/v1", "statefulsets", namespace, name),
                      body={"metadata": {"annotations": annotations}},
                      content_type="application/merge-patch+json")
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", **result}

    @needs(("get", "", "configmaps"))
    def read_config_map_key(self, namespace: str, name: str, key: str) -> str | None:
        try:
            data = self._request("get", "v1", "configmaps", "GET", _path("v1", "configmaps", namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        value = (data.get("data") or {}).get(key)
        return value if isinstance(value, str) else None

    # -- pods -----------------------------------------------------------------------------------------

    @needs(("delete", "", "pods"))
    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        try:
            self._request("delete", "v1", "pods", "DELETE", _path("v1", "pods", namespace, name),
                          body={"preconditions": {"uid": uid}})
        except ApiError as err:
            if err.status not in (404, 409):  # gone already, or a new pod of the same name
                raise

    # -- the self-signed webhook's configuration ------------------------------------------------------

    @needs(("patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations"))
    def set_webhooks(self, configuration: str, webhooks: list[dict]) -> None:
        """Replace the webhooks of ValidatingWebhookConfiguration `configuration` (merge patch: the
        list is replaced whole; the chart creates the object with none)."""
        api_version = "admissionregistration.k8s.io/v1"
        self._request("patch", api_version, "validatingwebhookconfigurations", "PATCH",
                      f"/apis/{api_version}/validatingwebhookconfigurations/{configuration}",
                      body={"webhooks": webhooks}, content_type="application/merge-patch+json")

    # -- events ---------------------------------------------------------------------------------------

    @needs(("create", "", "events"))
    def post_event(self, owner: dict, type_: str, reason: str, message: str) -> None:
        meta = owner["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER}, "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        self._request("create", "v1", "events", "POST", _path("v1", "events", meta["namespace"]), body=event)


def _message(body: str | bytes | None, fallback: str) -> str:
    """The API server's Status message, else `fallback`."""
    try:
        return str(json.loads(body or "").get("message") or fallback)
    except (TypeError, ValueError, AttributeError):
        return fallback


def connect(kubeconfig: str | None = None) -> Client:
    """A client from in-cluster config, else the kubeconfig (path, $KUBECONFIG or ~/.kube/config)."""
    config = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            raise kubernetes.config.ConfigException("explicit kubeconfig")
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
    config.connection_pool_maxsize = CONNECTIONS
    return Client(kubernetes.client.ApiClient(config))

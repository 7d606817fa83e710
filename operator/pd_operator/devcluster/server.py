"""The HTTP face of the emulated cluster: kmock's ``KubernetesEmulator`` routing over our ``Store``.

What kmock 0.8 still does for us: the aiohttp server (``kmock.Server``), the DSL routing of requests
to reactions and fallbacks (so tests may still add kmock reactions that take precedence, e.g.
``cluster.handler['get /api/v1/pods'] << 500``), the discovery endpoints built from its
``ResourcesArray``, streaming of async generators as JSON lines, and ``Status`` error rendering.

What is replaced, and why:

* ``__call__``: kmock's path parser crashes on ``/api/v1/namespaces`` (500) and misreads
  ``/api/v1/namespaces/<name>``; our parser knows namespaces are a resource. It is also where
  the request log and fault injection sit, since both need the raw connection.
* ``_handle``: skips ``KubernetesEmulator``'s own dict store (see ``store.py``). Its
  ``objects`` view therefore stays empty; use ``DevCluster.get``/``list`` instead.
* the ``_serve_*`` fallbacks: serve from the store -- POST answers 201, PUT is routed at all,
  PATCH honours its Content-Type, DELETE on a collection is deletecollection, lists carry
  ``metadata.resourceVersion``, watches resume from ``?resourceVersion=``, honour selectors,
  ``timeoutSeconds``, ``sendInitialEvents`` (with the initial-events-end bookmark), and report
  an expired resourceVersion as an in-stream ERROR 410 event, as the real server does.
  ``allowWatchBookmarks`` is accepted; no periodic bookmarks are sent.
* ``_serve_version``: kmock reports the core group as ``groupVersion: "/v1"``; ``_serve_api``:
  kmock omits ``serverAddressByClientCIDRs``, which the official client requires.

DELETE always answers 200 with the object (its last state, or the finalizing state), which every
client type-map accepts. Not served: subresources other than ``/status`` (scale, log, exec,
eviction), ``/openapi``, dry-run, pagination, authn/authz, admission webhooks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import apps, parsing, rendering

from . import patching
from .faults import FaultInjector
from .records import RequestLog, RequestRecord
from .store import END, ResourceType, Store, api_error

logger = logging.getLogger(__name__)

NAMESPACE_SUBRESOURCES = {"status", "finalize"}
WATCH_POLL_S = 1.0  # how often an idle watch checks for a gone client or an expired timeout


def parse_path(path: str) -> parsing.ParsedPath:
    """Split a Kubernetes API path into group/version/plural/namespace/name/subresource."""
    parts = [p for p in path.split("/") if p]
    version: str | None
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 2 and parts[0] == "apis":
        group, version, rest = parts[1], (parts[2] if len(parts) > 2 else None), parts[3:]
    else:
        return parsing.ParsedPath()
    namespace = None
    # /namespaces/<ns>/<plural>... is a namespaced resource; /namespaces[/<name>[/status]] is the
    # namespaces resource itself.
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return parsing.ParsedPath(group, version, plural, namespace, name, subresource)


def verb_of(request: rendering.Request) -> str | None:
    """The Kubernetes verb of a resource request (None for discovery and non-API paths)."""
    if request.resource is None or request.resource.plural is None:
        return None
    method = request.method.value
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if request.name else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)


# Requests kept in kmock's own history once tests add reactions of their own (see `_handle`).
KMOCK_HISTORY = 1024
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it


@attrs.define(kw_only=True)
class ApiHandler(kmock.KubernetesEmulator):
    store: Store
    faults: FaultInjector = attrs.field(factory=FaultInjector)
    log: RequestLog = attrs.field(factory=RequestLog)
    _served: int = attrs.field(default=0, init=False)
    _registered: tuple[Any, ...] = attrs.field(default=(), init=False)  # our reactions (kmock.Reaction)
    _builtin: tuple[Any, ...] = attrs.field(default=(), init=False)  # the same, by routing priority

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._resources = self.store.resources  # discovery reads the store's registry (incl. CRDs)
        self.fallback[kmock.method.PUT] << self._serve_replace
        self.fallback[kmock.method.DELETE] << self._serve_delete  # collections (no kmock action)
        self._registered = tuple(self._payloads)
        self._builtin = tuple(_by_priority(self._payloads))

    # -- entry point ------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw_request.read()
        record = RequestRecord(
            method=raw_request.method,
            path=raw_request.path,
            query=dict(raw_request.query),
            content_type=raw_request.headers.get("Content-Type"),
            timestamp=time.time(),
        )
        self.log.append(record)
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            request = self._parse(raw_request, body, id=self._served)
            self._served += 1
            record.verb = verb_of(request)
            response = await self._inject_fault(request, raw_request, record)
            if response is None:
                try:
                    response = await self._handle(request)
                except rendering.StreamingError as e:  # failed mid-stream: reuse the started response
                    raw_response = e.args[0]
                    raise e.__cause__ or e from None
        except Exception as e:
            if not isinstance(e, kmock.KubernetesError):
                logger.exception("Unexpected error while serving %s %s", raw_request.method, raw_request.path)
            if raw_response is None or not raw_response.prepared:
                response = await self._render_error(e)
            else:
                await self._stream_error(e, raw_response)
                await raw_response.write_eof()
                response = raw_response
        if record.fault != "drop":
            record.status = response.status
        return response

    def _parse(self, raw_request: aiohttp.web.BaseRequest, body: bytes, id: int) -> rendering.Request:
        k8s = parse_path(raw_request.path)
        method = kmock.method(raw_request.method)
        query = dict(raw_request.query)
        resource = (
            None
            if k8s.group is None
            else kmock.resource(group=k8s.group, version=k8s.version, plural=k8s.plural)
        )
        return rendering.Request(
            id=id,
            raw_request=raw_request,
            url=raw_request.url.with_path(raw_request.path.rstrip("/") or "/"),  # "/apis/" is "/apis"
            method=method,
            params=query,
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=body.decode("utf-8", "replace"),
            data=_decode(body, raw_request.content_type),
            action=parsing.guess_k8s(k8s, method, query),
            resource=resource,
            namespace=k8s.namespace,
            name=k8s.name,
            subresource=k8s.subresource,
        )

    async def _inject_fault(
        self, request: rendering.Request, raw_request: aiohttp.web.BaseRequest, record: RequestRecord
    ) -> aiohttp.web.StreamResponse | None:
        plural = request.resource.plural if request.resource is not None else None
        fault = self.faults.draw(record.verb, plural) if record.verb and plural else None
        record.fault = fault
        if fault == "slow":
            await asyncio.sleep(self.faults.delay_s)
        elif fault == "500":
            raise api_error(500, "InternalError", "Internal error occurred: injected fault")
        elif fault == "409":
            raise api_error(409, "Conflict", "Operation cannot be fulfilled: injected conflict")
        elif fault == "410":
            return await rendering.Response(payload=_gone("injected fault: too old resource version"))(
                request
            )
        elif fault == "drop":
            if raw_request.transport is not None:
                raw_request.transport.abort()
            return aiohttp.web.Response(status=500)  # never reaches the client
        return None

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        # Skip KubernetesEmulator._handle: it mirrors writes into kmock's dict store, which we replace.
        # kmock's own routing scans its request history once per reaction (to evaluate slices such
        # as `[:1]`): with 1024 requests kept that was ~45 ms per request, most of the emulator's
        # time. Our reactions filter on the request alone, so while no test has added reactions of
        # its own, they are matched against a one-request history and record nothing (`self.log`
        # is the request history tests read).
        if len(self._payloads) == len(self._registered) and all(
            a is b for a, b in zip(self._payloads, self._registered, strict=True)
        ):
            return await self._route(request).response(request)
        self._requests.append(request)
        del self._requests[:-KMOCK_HISTORY]
        return await apps.RawHandler._handle(self, request)

    def _route(self, request: rendering.Request) -> Any:
        """Our reaction for a request, by kmock's filters: synchronous, so the history is its own."""
        self._requests[:] = [request]
        try:
            for reaction in self._builtin:
                if request in reaction._source:
                    return reaction
        finally:
            self._requests.clear()
        raise AssertionError("unreachable: the not-found fallback matches every request")

    # -- resource endpoints -----------------------------------------------------------------------

    def _rt(self, request: rendering.Request) -> ResourceType:
        res = request.resource
        rt = (
            None
            if res is None or res.plural is None
            else self.store.resource_type(res.group or "", res.version, res.plural)
        )
        if rt is None:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return rt

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        rt = self._rt(request)
        items, rv = self.store.list(
            rt,
            request.namespace,
            request.params.get("labelSelector"),
            request.params.get("fieldSelector"),
            shared=True,
        )
        return {
            "apiVersion": rt.api_version,
            "kind": f"{rt.kind}List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        rt = self._rt(request)
        if request.subresource not in (None, "status") or (request.subresource and not rt.has_status):
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        assert request.name is not None
        return self.store.get(rt, request.namespace, request.name, shared=True)

    async def _serve_create(self, request: rendering.Request) -> rendering.Payload:
        rt = self._rt(request)
        obj = self.store.create(
            rt,
            request.namespace,
            _object_body(request),
            keep_status=False,
            field_manager=request.params.get("fieldManager"),
        )
        return kmock.Response(status=201, payload=obj)

    async def _serve_replace(self, request: rendering.Request) -> rendering.Payload:
        rt = self._rt(request)
        if request.name is None:
            raise api_error(405, "MethodNotAllowed", "PUT is only allowed on named objects")
        return self.store.update(
            rt,
            request.namespace,
            request.name,
            _object_body(request),
            subresource=request.subresource,
            field_manager=request.params.get("fieldManager"),
        )

    async def _serve_update(self, request: rendering.Request) -> rendering.Payload:
        rt = self._rt(request)
        patch_type = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if patch_type not in patching.PATCH_TYPES:
            raise api_error(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: "
                f"{patch_type}; accepted: {', '.join(patching.PATCH_TYPES)}",
            )
        assert request.name is not None
        obj, created = self.store.patch(
            rt,
            request.namespace,
            request.name,
            patch_type,
            request.data,
            subresource=request.subresource,
            field_manager=request.params.get("fieldManager"),
        )
        return kmock.Response(status=201 if created else 200, payload=obj)

    async def _serve_delete(self, request: rendering.Request) -> rendering.Payload:
        rt = self._rt(request)
        options = request.data if isinstance(request.data, dict) else {}
        if request.name is None:
            items = self.store.delete_collection(
                rt,
                request.namespace,
                request.params.get("labelSelector"),
                request.params.get("fieldSelector"),
            )
            return {
                "apiVersion": rt.api_version,
                "kind": f"{rt.kind}List",
                "metadata": {"resourceVersion": str(self.store.resource_version)},
                "items": items,
            }
        propagation = (
            request.params.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        )
        uid = (options.get("preconditions") or {}).get("uid")
        return self.store.delete(
            rt, request.namespace, request.name, propagation=propagation, precondition_uid=uid
        )

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        rt = self._rt(request)
        params = request.params
        initial = params.get("sendInitialEvents") == "true"
        since = (
            None
            if initial or params.get("resourceVersion") in (None, "", "0")
            else int(params["resourceVersion"])
        )
        fields = ",".join(
            filter(
                None, [params.get("fieldSelector"), f"metadata.name={request.name}" if request.name else None]
            )
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        try:
            watch, first = self.store.watch(
                loop,
                rt,
                request.namespace,
                label_selector=params.get("labelSelector"),
                field_selector=fields or None,
                since=since,
            )
        except kmock.KubernetesError as e:
            if e.status != 410:
                raise
            async for item in _gone(e.message or "Expired"):
                yield item
            return
        try:
            yield b""  # send the headers now, even if nothing happens for a while
            for event in first:
                yield event
            if initial:
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": rt.api_version,
                        "kind": rt.kind,
                        "metadata": {
                            "resourceVersion": str(self.store.resource_version),
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    },
                }
            while True:
                timeout = WATCH_POLL_S if deadline is None else min(WATCH_POLL_S, deadline - loop.time())
                if timeout <= 0:
                    return
                try:
                    item = await asyncio.wait_for(watch.queue.get(), timeout)
                except TimeoutError:
                    transport = request._raw_request.transport if request._raw_request else None
                    if transport is None or transport.is_closing():
                        return  # the client has gone away
                    continue
                if item is END:
                    return
                yield item
        finally:
            self.store.unwatch(watch)

    # -- discovery --------------------------------------------------------------------------------

    async def _serve_api(self, request: rendering.Request) -> rendering.Payload:
        # kmock omits serverAddressByClientCIDRs, which the official client's model requires.
        address = request._raw_request.host if request._raw_request else ""
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        }

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        group, version = request.resource.group or "", request.resource.version
        # iter(): ResourcesArray yields kmock.resource; its Mapping base is typed with the wider key
        resources = [
            res for res in list(iter(self._resources)) if (res.group, res.version) == (group, version)
        ]
        if not resources:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        entries = []
        for res in sorted(resources, key=lambda r: r.plural or ""):
            info = self._resources[res]
            entry = {
                "name": res.plural,
                "singularName": info.singular or "",
                "namespaced": bool(info.namespaced),
                "kind": info.kind,
                "verbs": sorted(info.verbs),
            }
            if info.shortnames:
                entry["shortNames"] = sorted(info.shortnames)
            if info.categories:
                entry["categories"] = sorted(info.categories)
            entries.append(entry)
            entries.extend(
                {
                    "name": f"{res.plural}/{sub}",
                    "singularName": "",
                    "namespaced": bool(info.namespaced),
                    "kind": info.kind,
                    "verbs": ["get", "patch", "update"],
                }
                for sub in sorted(info.subresources)
            )
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }


def _by_priority(reactions: list[Any]) -> list[Any]:
    """Reactions in kmock's routing order (as ``kmock._internal.apps.RawHandler._handle`` sorts them:
    highest priority first, priority tuples zero-padded to one length, ties in registration order)."""
    width = max((len(r.priorities) for r in reactions), default=0)
    return sorted(
        reactions, key=lambda r: tuple(-p for p in r.priorities) + (0,) * (width - len(r.priorities))
    )


def _decode(body: bytes, content_type: str) -> Any:
    if not body:
        return None
    try:
        if content_type.endswith("yaml"):
            # Clients send apply-patch+yaml bodies as JSON (kopf, the official client): parsing
            # them as JSON first costs ~1/100 of pure-Python YAML, and JSON is valid YAML.
            try:
                return json.loads(body)
            except ValueError:
                return yaml.load(body, Loader=_YAML_LOADER)
        return json.loads(body)
    except (ValueError, yaml.YAMLError):
        raise api_error(400, "BadRequest", f"cannot decode the request body as {content_type}") from None


def _object_body(request: rendering.Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise api_error(400, "BadRequest", "the request body must be a JSON object")
    return request.data


async def _gone(message: str) -> AsyncIterator[rendering.Payload]:
    """A watch stream that only says "your resourceVersion is too old", as kube-apiserver does."""
    yield {
        "type": "ERROR",
        "object": {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "reason": "Expired",
            "code": 410,
            "message": message,
        },
    }

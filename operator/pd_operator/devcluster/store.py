"""A thread-safe, versioned object store with the API-machinery semantics kube-apiserver provides.

kmock 0.8's ``KubernetesEmulator`` keeps objects as plain dicts merged on PATCH, which misses what
operators depend on: uid, a global resourceVersion with optimistic concurrency, generation rules,
the /status subresource split, finalizers, owner-reference garbage collection, resumable watches.
Its store also lives inside the server's event loop, while tests need to read and seed objects
from their own thread. So the state lives here instead, guarded by one ``threading.RLock``; the
HTTP layer (``server.py``) and the direct test API (``cluster.py``) both call into it.

Semantics (mirroring kube-apiserver):

* ``metadata.resourceVersion`` is one global counter, bumped once per change (including deletion);
  no-op updates do not bump it. ``metadata.uid`` and ``creationTimestamp`` are set on create.
* ``metadata.generation`` starts at 1 and is bumped when anything but ``metadata`` changes -- and
  also not for ``status`` when the kind has a status subresource (as in the real server).
* For kinds with a status subresource, writes to the main endpoint keep the stored ``.status`` and
  writes to ``/status`` change only ``.status``. Create over HTTP drops ``.status`` (like the real
  create strategies); the direct store API keeps it so tests can seed state.
* A given ``metadata.resourceVersion`` on update/patch is a precondition (409 Conflict if stale).
* DELETE of an object with finalizers sets ``deletionTimestamp``; the update that removes the last
  finalizer deletes it. Deleting an owner deletes its dependents (matched by ownerReferences uid),
  recursively; ``propagationPolicy=Orphan`` strips the references instead; ``Foreground`` is
  treated as ``Background``. Deleting a namespace deletes everything in it immediately (there is
  no Terminating phase). Dependents whose owner never existed are not collected.
* Watches replay the event log after a given resourceVersion (410 Gone once it is compacted, after
  ``HISTORY`` events), or start with synthetic ADDED events of the current state. With a label
  selector, objects entering/leaving the selection are reported as ADDED/DELETED, like the real
  watch cache does.
* Objects of a group+plural share one bucket across versions (CRD conversion strategy None).
  Built-in kinds served by two groups (v1 and events.k8s.io/v1 events) are separate buckets.
  Creating a CustomResourceDefinition registers its resource (and marks it Established);
  deleting it unregisters the resource and drops its objects without events.
* No defaulting or schema validation, except Pod ``status.phase=Pending`` and Namespace
  ``status.phase=Active`` on create. No pagination (``limit``/``continue`` are ignored).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import copy
import dataclasses
import datetime
import random
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import kmock

from . import catalog, patching, selectors

HISTORY = 10_000  # watch events kept for resumption; older resourceVersions get 410 Gone

Obj = dict[str, Any]
Bucket = tuple[str, str]  # (group, plural)
Key = tuple[str | None, str]  # (namespace, name)


def api_error(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """A Kubernetes ``Status`` failure, rendered by kmock's error renderer."""
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


@dataclasses.dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def bucket(self) -> Bucket:
        return (self.group, self.plural)

    def not_found(self, name: str) -> kmock.KubernetesError:
        return api_error(
            404,
            "NotFound",
            f'{self.plural}{self._gsuffix} "{name}" not found',
            name=name,
            group=self.group,
            kind=self.plural,
        )

    def conflict(self, name: str, message: str, reason: str = "Conflict") -> kmock.KubernetesError:
        return api_error(
            409,
            reason,
            f'{self.plural}{self._gsuffix} "{name}" {message}',
            name=name,
            group=self.group,
            kind=self.plural,
        )

    @property
    def _gsuffix(self) -> str:
        return f".{self.group}" if self.group else ""


@dataclasses.dataclass(frozen=True)
class Event:
    rv: int
    bucket: Bucket
    type: str  # ADDED / MODIFIED / DELETED
    obj: Obj  # the state after the change (the last state for DELETED); never mutated
    old: Obj | None  # the state before a MODIFIED change


END = None  # queue sentinel: the watch stream must end (break_watches, shutdown)


class Watch:
    """One watch stream's subscription; events arrive in ``queue`` on the owning event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rt: ResourceType | None,
        namespace: str | None,
        match: Callable[[Obj], bool] = lambda obj: True,
    ) -> None:
        self.loop, self.rt, self.namespace, self.match = loop, rt, namespace, match
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def translate(self, event: Event) -> Event | dict[str, Any] | None:
        """The wire event this watcher should see for a store event, if any (raw feeds: as is)."""
        if self.rt is None:
            return event
        if event.bucket != self.rt.bucket:
            return None
        meta = event.obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return None
        now_in = self.match(event.obj)
        was_in = event.old is not None and self.match(event.old)
        kind = event.type
        if kind == "MODIFIED" and now_in != was_in:
            kind = "ADDED" if now_in else "DELETED"
        elif not now_in:
            return None
        return {"type": kind, "object": {**event.obj, "apiVersion": self.rt.api_version}}

    def offer(self, item: Event | dict[str, Any] | None) -> bool:
        """Deliver from any thread; False if the owning loop is gone."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # loop closed
            return False
        return True


class Store:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.resources: kmock.ResourcesArray = catalog.builtin_resources()  # shared with discovery
        self._objects: dict[Bucket, dict[Key, Obj]] = collections.defaultdict(dict)
        self._rv = 0
        self._log: collections.deque[Event] = collections.deque(maxlen=HISTORY)
        self._compacted_rv = 0  # events with rv <= this are gone from the log
        self._watches: set[Watch] = set()
        self._names = random.Random(0)  # generateName suffixes: deterministic per run
        self._types: dict[tuple[str, str | None, str | None], ResourceType | None] = {}

    # -- resource types ---------------------------------------------------------------------------

    def resource_type(self, group: str, version: str | None, plural: str | None) -> ResourceType | None:
        # Memoised (every request resolves its type; kmock's resource lookup costs ~0.5 ms); the
        # memo is dropped whenever the registry changes (CRD created or deleted).
        key = (group, version, plural)
        if key in self._types:  # no lock needed: a dict read is atomic and entries never change
            return self._types[key]
        with self._lock:
            if key not in self._types:
                self._types[key] = self._lookup_type(group, version, plural)
            return self._types[key]

    def _lookup_type(self, group: str, version: str | None, plural: str | None) -> ResourceType | None:
        res = kmock.resource(group=group, version=version, plural=plural)
        if res not in self.resources:  # NB: indexing a missing key would auto-create it
            return None
        info = self.resources[res]
        return ResourceType(
            group,
            version or "",
            plural or "",
            info.kind or "",
            bool(info.namespaced),
            "status" in info.subresources,
        )

    def find_type(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        with self._lock:
            # iter(): ResourcesArray yields kmock.resource; its Mapping base is typed with the wider key
            for res in list(iter(self.resources)):
                if res.group == group and res.version == version and self.resources[res].kind == kind:
                    rt = self.resource_type(group, version, res.plural)
                    assert rt is not None
                    return rt
        raise api_error(404, "NotFound", f"no resource for {api_version} {kind}")

    def _register_crd(self, crd: Obj) -> None:
        for res, info in catalog.crd_resources(crd).items():
            self.resources[res] = info
        self._types.clear()

    def _unregister_crd(self, crd: Obj) -> None:
        for res in catalog.crd_resources(crd):
            del self.resources[res]
        self._types.clear()
        self._objects.pop((crd["spec"]["group"], crd["spec"]["names"]["plural"]), None)

    # -- reads --------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    # Reads return deep copies the caller may change, or with ``shared=True`` read-only objects
    # that share all but their top level with the store (stored objects are never changed in
    # place, only replaced): for callers that only read or serialise them (the HTTP layer, the
    # workload controllers), since deep copies were a large share of the emulator's time. Copies
    # are made after the lock is released, so a test thread copying every pod does not stall the
    # server thread.

    def get(self, rt: ResourceType, namespace: str | None, name: str, *, shared: bool = False) -> Obj:
        with self._lock:
            obj = self._objects[rt.bucket].get((self._ns(rt, namespace), name))
        if obj is None:
            raise rt.not_found(name)
        return self._render(rt, obj, shared)

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        shared: bool = False,
    ) -> tuple[builtins.list[Obj], int]:
        match = self._matcher(rt, label_selector, field_selector)
        with self._lock:
            selected = [
                (key, obj)
                for key, obj in self._objects[rt.bucket].items()
                if (namespace is None or key[0] == namespace) and match(obj)
            ]
            rv = self._rv
        selected.sort(key=lambda kv: (kv[0][0] or "", kv[0][1]))
        return [self._render(rt, obj, shared) for _, obj in selected], rv

    @staticmethod
    def _matcher(
        rt: ResourceType, label_selector: str | None, field_selector: str | None
    ) -> Callable[[Obj], bool]:
        try:
            by_label = selectors.parse_label_selector(label_selector)
            by_field = selectors.parse_field_selector(field_selector, rt.plural)
        except selectors.SelectorError as e:
            raise api_error(400, "BadRequest", str(e)) from None
        return lambda obj: by_label(obj) and by_field(obj)

    # -- writes -------------------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Obj,
        *,
        keep_status: bool,
        field_manager: str | None = None,
        operation: str = "Update",
    ) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        with self._lock:
            namespace = self._ns(rt, namespace or meta.get("namespace"))
            if rt.namespaced:
                if meta.get("namespace", namespace) != namespace:
                    raise api_error(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match "
                        "the namespace sent on the request",
                    )
                if (
                    rt.bucket != ("", "namespaces")
                    and (None, namespace) not in self._objects[("", "namespaces")]
                ):
                    raise api_error(
                        404,
                        "NotFound",
                        f'namespaces "{namespace}" not found',
                        name=namespace,
                        kind="namespaces",
                    )
                meta["namespace"] = namespace
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise api_error(422, "Invalid", "metadata.name or metadata.generateName is required")
                meta["name"] = meta["generateName"] + "".join(
                    self._names.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
                )
            name = meta["name"]
            if (namespace, name) in self._objects[rt.bucket]:
                raise rt.conflict(name, "already exists", reason="AlreadyExists")
            obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
            for system_field in ("resourceVersion", "deletionTimestamp", "managedFields"):
                meta.pop(system_field, None)
            meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=_now())
            if not keep_status:
                obj.pop("status", None)
            self._default_status(rt, obj)
            self._record_manager(rt, obj, field_manager, operation)
            if rt.bucket == ("apiextensions.k8s.io", "customresourcedefinitions"):
                self._register_crd(obj)
                obj["status"] = {
                    "acceptedNames": obj["spec"]["names"],
                    "storedVersions": [
                        v["name"] for v in obj["spec"].get("versions", []) if v.get("storage")
                    ],
                    "conditions": [
                        {"type": t, "status": "True", "reason": t, "lastTransitionTime": _now()}
                        for t in ("NamesAccepted", "Established")
                    ],
                }
            self._commit(rt, "ADDED", obj, None)
            return self._render(rt, obj)

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Obj:
        """PUT: replace the object (or only its status for ``subresource='status'``)."""
        new = copy.deepcopy(body)
        if new.get("metadata", {}).get("name", name) != name:
            raise api_error(400, "BadRequest", "the name of the object does not match the name on the URL")
        with self._lock:
            old = self._live(rt, namespace, name)
            return self._update(rt, old, new, subresource, field_manager, "Update")

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: str,
        body: Any,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> tuple[Obj, bool]:
        """PATCH of any flavour; server-side apply creates absent objects. Returns (object, created)."""
        with self._lock:
            ns = self._ns(rt, namespace)
            if patch_type == patching.APPLY_PATCH:
                if not field_manager:
                    raise api_error(422, "Invalid", "fieldManager is required for apply requests")
                if (ns, name) not in self._objects[rt.bucket] and subresource is None:
                    body = {**body, "metadata": {**body.get("metadata", {}), "name": name}}
                    return self.create(
                        rt, ns, body, keep_status=False, field_manager=field_manager, operation="Apply"
                    ), True
            old = self._live(rt, ns, name)
            try:
                new = patching.apply_patch(copy.deepcopy(old), patch_type, body)
            except patching.PatchError as e:
                raise api_error(422, "Invalid", f"the patch cannot be applied: {e}") from None
            operation = "Apply" if patch_type == patching.APPLY_PATCH else "Update"
            return self._update(rt, old, new, subresource, field_manager, operation), False

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        precondition_uid: str | None = None,
    ) -> Obj:
        with self._lock:
            obj = self._live(rt, namespace, name)
            if precondition_uid and precondition_uid != obj["metadata"]["uid"]:
                raise rt.conflict(name, "precondition failed: UID mismatch")
            return self._render(rt, self._delete(rt, obj, propagation))

    def delete_collection(
        self, rt: ResourceType, namespace: str | None, label_selector: str | None, field_selector: str | None
    ) -> builtins.list[Obj]:
        with self._lock:
            items, _ = self.list(rt, namespace, label_selector, field_selector, shared=True)
            return [
                self.delete(rt, item["metadata"].get("namespace"), item["metadata"]["name"]) for item in items
            ]

    # -- watching -----------------------------------------------------------------------------------

    def watch(
        self,
        loop: asyncio.AbstractEventLoop,
        rt: ResourceType,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        since: int | None = None,
    ) -> tuple[Watch, builtins.list[dict[str, Any]]]:
        """Subscribe; returns the watch and the events to send first (replay or initial ADDED)."""
        watch = Watch(loop, rt, namespace, self._matcher(rt, label_selector, field_selector))
        with self._lock:
            if since is None:
                items, _ = self.list(rt, namespace, label_selector, field_selector, shared=True)
                first = [{"type": "ADDED", "object": item} for item in items]
            elif since < self._compacted_rv:
                raise api_error(410, "Expired", f"too old resource version: {since} ({self._compacted_rv})")
            else:
                first = [
                    e
                    for e in (watch.translate(ev) for ev in self._log if ev.rv > since)
                    if isinstance(e, dict)
                ]
            self._watches.add(watch)
            return watch, first

    def subscribe(self, loop: asyncio.AbstractEventLoop) -> Watch:
        """A raw feed of every change of every resource (for the emulated controllers)."""
        watch = Watch(loop, None, None)
        with self._lock:
            self._watches.add(watch)
        return watch

    def unwatch(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def break_watches(self) -> int:
        """End all open watch streams (clients see EOF and reconnect). Returns how many."""
        with self._lock:
            watches = [w for w in self._watches if w.rt is not None]
            for watch in watches:
                self._watches.discard(watch)
                watch.offer(END)
            return len(watches)

    def close_all(self) -> None:
        with self._lock:
            for watch in self._watches:
                watch.offer(END)
            self._watches.clear()

    # -- internals ----------------------------------------------------------------------------------

    @staticmethod
    def _ns(rt: ResourceType, namespace: str | None) -> str | None:
        return namespace if rt.namespaced else None

    @staticmethod
    def _render(rt: ResourceType, obj: Obj, shared: bool = False) -> Obj:
        if shared:
            return {**obj, "apiVersion": rt.api_version}
        result = copy.deepcopy(obj)
        result["apiVersion"] = rt.api_version
        return result

    def _live(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._objects[rt.bucket].get((self._ns(rt, namespace), name))
        if obj is None:
            raise rt.not_found(name)
        return obj

    def _update(
        self,
        rt: ResourceType,
        old: Obj,
        new: Obj,
        subresource: str | None,
        field_manager: str | None,
        operation: str,
    ) -> Obj:
        old_meta = old["metadata"]
        name = old_meta["name"]
        given_rv = (new.get("metadata") or {}).get("resourceVersion")
        if given_rv and given_rv != old_meta["resourceVersion"]:
            raise rt.conflict(
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        if subresource == "status" and rt.has_status:
            new = {**copy.deepcopy(old), "status": new.get("status")}
        elif subresource is not None:
            raise api_error(404, "NotFound", f"subresource {subresource!r} is not served")
        elif rt.has_status:
            new["status"] = copy.deepcopy(old.get("status"))
        if new.get("status") is None:
            new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for kept in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
            "resourceVersion",
            "managedFields",
        ):
            if kept in old_meta:
                meta[kept] = old_meta[kept]
            else:
                meta.pop(kept, None)
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        if new == old:
            return self._render(rt, old)  # no-op: no new resourceVersion, no event
        self._record_manager(rt, new, field_manager, operation)
        excluded = {"metadata", "status"} if rt.has_status else {"metadata"}
        if {k: v for k, v in new.items() if k not in excluded} != {
            k: v for k, v in old.items() if k not in excluded
        }:
            meta["generation"] = old_meta.get("generation", 1) + 1
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._render(rt, self._remove(rt, new))
        self._commit(rt, "MODIFIED", new, old)
        return self._render(rt, new)

    def _delete(self, rt: ResourceType, obj: Obj, propagation: str) -> Obj:
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return obj
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            self._commit(rt, "MODIFIED", new, obj)
            return new
        if rt.bucket == ("", "namespaces"):
            for bucket, objs in list(self._objects.items()):
                bucket_rt = self._bucket_type(bucket)
                for key, child in list(objs.items()):
                    if bucket_rt and key[0] == meta["name"] and key in self._objects[bucket]:
                        self._delete(bucket_rt, child, propagation)
        return self._remove(rt, obj, orphan=propagation == "Orphan")

    def _remove(self, rt: ResourceType, obj: Obj, orphan: bool = False) -> Obj:
        meta = obj["metadata"]
        del self._objects[rt.bucket][(meta.get("namespace"), meta["name"])]
        last = copy.deepcopy(obj)
        self._rv += 1
        last["metadata"]["resourceVersion"] = str(self._rv)
        self._emit(Event(self._rv, rt.bucket, "DELETED", last, None))
        if rt.bucket == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._unregister_crd(obj)
        self._collect_dependents(meta["uid"], orphan)
        return last

    def _collect_dependents(self, owner_uid: str, orphan: bool) -> None:
        for bucket, objs in list(self._objects.items()):
            bucket_rt = self._bucket_type(bucket)
            for child in list(objs.values()):
                refs = child["metadata"].get("ownerReferences") or []
                if bucket_rt is None or not any(ref.get("uid") == owner_uid for ref in refs):
                    continue
                if orphan:
                    kept = [ref for ref in refs if ref.get("uid") != owner_uid]
                    new = copy.deepcopy(child)
                    if kept:
                        new["metadata"]["ownerReferences"] = kept
                    else:
                        del new["metadata"]["ownerReferences"]
                    self._update(bucket_rt, child, new, None, None, "Update")
                elif (child["metadata"].get("namespace"), child["metadata"]["name"]) in objs:
                    self._delete(bucket_rt, child, "Background")

    def _bucket_type(self, bucket: Bucket) -> ResourceType | None:
        for res in self.resources:
            if (res.group, res.plural) == bucket:
                assert res.group is not None  # equal to the bucket's group, which is a str
                return self.resource_type(res.group, res.version, res.plural)
        return None

    def _commit(self, rt: ResourceType, kind: str, obj: Obj, old: Obj | None) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        meta = obj["metadata"]
        self._objects[rt.bucket][(meta.get("namespace"), meta["name"])] = obj
        self._emit(Event(self._rv, rt.bucket, kind, obj, old))

    def _emit(self, event: Event) -> None:
        if len(self._log) == self._log.maxlen:
            self._compacted_rv = self._log[0].rv
        self._log.append(event)
        for watch in list(self._watches):
            wire = watch.translate(event)
            if wire is not None and not watch.offer(wire):
                self._watches.discard(watch)

    @staticmethod
    def _default_status(rt: ResourceType, obj: Obj) -> None:
        if rt.bucket == ("", "pods"):
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        elif rt.bucket == ("", "namespaces"):
            obj.setdefault("status", {}).setdefault("phase", "Active")

    @staticmethod
    def _record_manager(rt: ResourceType, obj: Obj, manager: str | None, operation: str) -> None:
        if not manager:
            return
        entries: Iterable[Obj] = obj["metadata"].get("managedFields") or []
        entry = {
            "manager": manager,
            "operation": operation,
            "apiVersion": rt.api_version,
            "time": _now(),
            "fieldsType": "FieldsV1",
            "fieldsV1": {},
        }
        others = [e for e in entries if (e.get("manager"), e.get("operation")) != (manager, operation)]
        obj["metadata"]["managedFields"] = others + [entry]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

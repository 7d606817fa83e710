"""Runs reconciles for the kopf handlers: one at a time per PDDeployment, on the freshest object,
coalescing bursts of events, plus the drift loop.

Handlers only say *which* object to reconcile; the runner reads the object itself under the
object's lock, so two triggers never race and a stale event body can never make a redundant status
write. Every event that comes while a reconcile waits to start folds into it, and every event that
comes while one runs into one reconcile after it: a fresh object's burst of child events costs one
follow-up, not one each.

A PDDeployment is reconciled when its spec is new to the runner: first seen (`create`, or
`resume` when the operator starts), or a new metadata.generation (`update`); its status writes
(ours) change no generation and trigger nothing. kopf keeps no state on the object (no annotations
of its own, so the operator needs no write to PDDeployments but their status). A reconcile that
failed on a temporary API error is retried after RETRY_DELAYS.

Children and pods come from kopf's indexes (kept current by its watches, like an informer cache), so
a reconcile costs one read instead of a list per kind. An index may lag an apply under load, so the
runner remembers what it wrote itself until a watch event for that child arrives (at most
WRITE_MEMORY_S): otherwise every child event of a fresh object would re-apply its siblings. Any
event ends the memory, so a hand deletion is seen as soon as it happens. A child's event that only
echoes the runner's own write (the resourceVersion its write returned) triggers no reconcile: it
shows nothing the runner did not know.

The pods a reconcile deleted are remembered by uid until the index shows them going (terminating
or gone), and left out of the reconciles until then: a reconcile right after a deletion would
otherwise count the deleted pods as serving and let another instance leave (the expectations a
ReplicaSet controller keeps for its own deletions: kubernetes: pkg/controller/controller_utils.go
@ v1.36.3, UIDTrackingControllerExpectations).

A pod seen Failed in a watch event is remembered too, until a reconcile has seen it: the
StatefulSet controller deletes a Failed pod and makes a new one at once, often before the
reconcile reads the index, and the other ranks of that engine must still be restarted with it.

The drift loop replaces `@kopf.timer`: kopf puts a finalizer on every
object with a timer, and this operator needs none (children go with their owner references).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import marshal
import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, TypeVar

from pd_operator.controller.client import ApiError, Client
from pd_operator.controller.diff import Key
from pd_operator.controller.diff import key as child_key
from pd_operator.controller.metrics import Metrics
from pd_operator.controller.pods import has_failed, is_terminating
from pd_operator.controller.proxy_state import ProxyStateReader
from pd_operator.controller.reconcile import InvalidSpec, Outcome, reconcile
from pd_operator.render import Boundary
from pd_operator.render.policy import CHART_DEFAULT
from pd_operator.serving_image.contents import DEFAULT_TOOLS_IMAGE
from pd_operator.spec.host_paths import DEFAULT, HostPathPolicy
from pd_operator.spec.node_access import DEFAULT as NO_NODE_ACCESS
from pd_operator.spec.node_access import NodeAccess

logger = logging.getLogger(__name__)

ObjKey = tuple[str, str]
T = TypeVar("T")
WRITE_MEMORY_S = 10.0
RETRY_DELAYS = (1, 2, 5, 10, 30, 60)
"""Seconds before retrying a reconcile after its 1st, 2nd, ... temporary API error in a row."""
RECONCILE_WORKERS = 8
"""Reconciles at once. Each runs in a thread of its own (it blocks on its API requests, which it
sends in parallel where it can: client.concurrently); more would add to the time each holds the
GIL that kopf's event loop (watches) and the webhook's thread need too."""
SPEC_TRIGGERS = {None: "resume", "ADDED": "create"}
"""The trigger of a PDDeployment's new spec by its watch event type (None: kopf's initial listing);
any other event with a new generation is an `update`."""


def tree_copy(obj: T) -> T:
    """A deep copy of a JSON tree (dicts, lists, strings, numbers, booleans, None), as the API
    server's objects are; anything else raises ValueError. marshal's round trip is C: it takes about
    a third of copy.deepcopy's time, whose copies of children and pods were 16% of the operator's
    Python CPU with 100 PDDeployments (docs/benchmarks.md#reconcile-cost)."""
    copied: T = marshal.loads(marshal.dumps(obj))  # type: ignore[arg-type]
    return copied


def index_id(resource: str) -> str:
    """The kopf id of the index of one watched kind, by owning PDDeployment (also its kwarg name):
    `resource` is its plural, or `plural.group` where two kinds share a plural (PodGroups)."""
    return f"{re.sub(r'[^a-z0-9]', '_', resource)}_by_owner"


class Runner:
    def __init__(self, client: Client, metrics: Metrics, *, debounce_s: float = 0.2,
                 drift_interval_s: float = 30.0, host_path_policy: HostPathPolicy = DEFAULT,
                 tools_image: str = DEFAULT_TOOLS_IMAGE, boundary: Boundary = CHART_DEFAULT,
                 node_access: NodeAccess = NO_NODE_ACCESS) -> None:
        self.client = client
        self.boundary = boundary
        """Who outside a PDDeployment its NetworkPolicies admit (render/policy.py)."""
        self.host_path_policy = host_path_policy
        """The admin's host path allow-list: the reconcile and the webhook validate with it."""
        self.tools_image = tools_image
        """The operator's own image (--tools-image): the rendered pods' tools bundle and proxy."""
        self.node_access = node_access
        """The admin's node-access allowances (spec/node_access.py)."""
        self.proxies = ProxyStateReader()
        self.metrics = metrics
        self.debounce_s = debounce_s
        self.drift_interval_s = drift_interval_s
        self._locks: dict[ObjKey, asyncio.Lock] = {}
        self._pending: set[ObjKey] = set()
        self._last_run: dict[ObjKey, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._indexes: dict[str, Mapping[ObjKey, Iterable[dict]]] = {}
        # Own writes the indexes may not show yet: child key -> (when, object or None if deleted).
        self._written: dict[ObjKey, dict[Key, tuple[float, dict | None]]] = {}
        self._event_at: dict[tuple[ObjKey, Key], float] = {}
        # Pods a watch event showed failed, by uid, until a reconcile has seen them.
        self._failed: dict[ObjKey, dict[str, dict]] = {}
        # Pods our reconciles deleted, by uid, until the index shows them terminating or gone.
        self._deleted: dict[ObjKey, set[str]] = {}
        self._generations: dict[ObjKey, Any] = {}
        self._retries: dict[ObjKey, int] = {}
        # Child events that came while a reconcile of their owner ran: (child, resourceVersion).
        self._during: dict[ObjKey, list[tuple[Key, str | None]]] = {}
        # Reconciles running (_slot), those waiting for one (in the order they came), and the objects
        # whose next reconcile is for a new spec.
        self._running = 0
        self._waiting: dict[ObjKey, asyncio.Future[None]] = {}
        self._new_spec: set[ObjKey] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(RECONCILE_WORKERS,
                                                               thread_name_prefix="reconcile")

    def use_indexes(self, plurals: Iterable[str], handler_kwargs: Mapping[str, Any]) -> None:
        """Remember kopf's indexes, which it only hands to handlers (as keyword arguments)."""
        self._indexes = {plural: handler_kwargs[index_id(plural)] for plural in plurals}

    def _snapshot(self, key: ObjKey) -> tuple[list[dict], list[dict]]:
        """(children, pods) of one PDDeployment, copied in the event loop (kopf mutates them there),
        with this runner's own recent writes laid over children the index does not show yet, and
        pods seen failed that the index no longer shows live (already deleted or replaced)."""
        children: list[dict] = []
        pods: list[dict] = []
        for plural, index in self._indexes.items():
            (pods if plural == "pods" else children).extend(tree_copy(list(index.get(key, []))))
        live = {p["metadata"].get("uid") for p in pods if not is_terminating(p)}
        deleted = self._deleted.get(key, set())
        deleted &= live  # the index shows the others going: it is the truth again
        pods = [p for p in pods if p["metadata"].get("uid") not in deleted]
        pods += [tree_copy(p) for uid, p in self._failed.get(key, {}).items()
                 if uid not in live and uid not in deleted]
        return self._with_own_writes(key, children), pods

    def _with_own_writes(self, key: ObjKey, children: list[dict]) -> list[dict]:
        written = self._written.get(key, {})
        indexed = {child_key(c): c for c in children}
        now = time.monotonic()
        for k, (when, obj) in list(written.items()):
            if now - when > WRITE_MEMORY_S:
                del written[k]
            elif obj is None:
                indexed.pop(k, None)
            else:
                indexed[k] = tree_copy(obj)
        return list(indexed.values())

    def child_event(self, key: ObjKey, child: dict) -> None:
        """A watch event for one child: the index now shows it, so forget our own write of it, and
        reconcile soon unless the event only echoes that write (see the module doc; whether it does
        is decided when a reconcile running now has returned its writes). A pod's event carries the
        whole pod: a failed one is remembered (see the module doc)."""
        if child.get("kind") == "Pod":
            if has_failed(child) and not is_terminating(child):
                self._failed.setdefault(key, {})[child["metadata"]["uid"]] = tree_copy(child)
            self.poke(*key)
            return
        ck = child_key(child)
        version = child["metadata"].get("resourceVersion")
        self._event_at[(key, ck)] = time.monotonic()
        own = self._written.get(key, {}).pop(ck, None)
        if own is not None and _version(own[1]) == version is not None:
            return
        if key in self._during:
            self._during[key].append((ck, version))
            return
        self.poke(*key)

    def _remember(self, key: ObjKey, outcome: Outcome, since: float) -> None:
        """Remember this reconcile's writes, unless their watch event already came (after `since`)."""
        if outcome.deleted_pods:
            self._deleted.setdefault(key, set()).update(outcome.deleted_pods)
        written = self._written.setdefault(key, {})
        now = time.monotonic()
        writes = [(obj, obj) for obj in outcome.applied] + [(obj, None) for obj in outcome.pruned]
        for obj, memory in writes:
            ck = child_key(obj)
            seen_at = self._event_at.get((key, ck))
            if seen_at is None or seen_at < since:
                written[ck] = (now, memory)

    async def run(self, namespace: str, name: str, trigger: str) -> Outcome | None:
        """Reconcile now; None when the object is gone. Raises InvalidSpec or ApiError."""
        key = (namespace, name)
        async with self._locks.setdefault(key, asyncio.Lock()), self._slot(key):
            self._pending.discard(key)  # events from here on are after the read below: a run of their own
            self._new_spec.discard(key)
            self._during[key] = []
            started = time.perf_counter()
            since = time.monotonic()
            result = "ok"
            outcome: Outcome | None = None
            gone = False
            try:
                body = await self._in_thread(self.client.get_pddeployment, namespace, name)
                if body is None:
                    gone = True
                    self.forget(namespace, name)
                    return None
                children, pods = self._snapshot(key)
                seen_failed = set(self._failed.get(key, {}))
                outcome = await self._in_thread(reconcile, self.client, self.proxies, body, children, pods,
                                                host_path_policy=self.host_path_policy,
                                                tools_image=self.tools_image, boundary=self.boundary,
                                                node_access=self.node_access)
                self._remember(key, outcome, since)
                for uid in seen_failed:
                    self._failed.get(key, {}).pop(uid, None)
                self.metrics.observe(namespace, name, outcome.ready, outcome.kv_compatible)
                if outcome.requeue_after is not None:
                    asyncio.get_running_loop().call_later(outcome.requeue_after, self.poke, namespace, name,
                                                          "requeue")
                return outcome
            except InvalidSpec:
                result = "invalid"
                self.metrics.errors.labels("invalid_spec").inc()
                self.metrics.observe(namespace, name, False, False)
                raise
            except ApiError as err:
                result = "error"
                self.metrics.errors.labels("api_temporary" if err.temporary else "api_permanent").inc()
                raise
            finally:
                if not gone:  # the drift loop has no more business with a deleted object
                    self._last_run[key] = time.monotonic()
                self.metrics.reconciles.labels(trigger, result).inc()
                self.metrics.duration.observe(time.perf_counter() - started)
                self._after(key, outcome)

    def _after(self, key: ObjKey, outcome: Outcome | None) -> None:
        """Reconcile again for the child events that came during this run, unless each only echoed one
        of its writes (or the run failed: then any event counts)."""
        during = self._during.pop(key, [])
        written = {(child_key(o), _version(o)) for o in outcome.applied} if outcome else set()
        if any(seen not in written for seen in during):
            self.poke(*key)

    @contextlib.asynccontextmanager
    async def _slot(self, key: ObjKey) -> AsyncIterator[None]:
        """One of the RECONCILE_WORKERS reconciles that run at once. When all are taken, a waiting
        new spec (create, update, resume) goes before waiting follow-ups of child events, each kind
        in the order it came: a burst of creates gets its children written before the follow-ups
        of the first ones' status changes (which fold more events the longer they wait)."""
        if self._running < RECONCILE_WORKERS and not self._waiting:
            self._running += 1
        else:
            turn = asyncio.get_running_loop().create_future()
            self._waiting[key] = turn
            try:
                await turn
            except asyncio.CancelledError:
                if self._waiting.get(key) is turn:
                    del self._waiting[key]
                elif not turn.cancelled():  # handed the slot as it was cancelled: pass it on
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        self._running -= 1
        following = next((k for k in self._waiting if k in self._new_spec), next(iter(self._waiting), None))
        if following is not None:
            self._running += 1
            self._waiting.pop(following).set_result(None)

    async def _in_thread(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on a reconcile thread (it blocks on API requests)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor,
                                                                functools.partial(fn, *args, **kwargs))

    def spec_event(self, namespace: str, name: str, event_type: str | None, generation: Any) -> None:
        """A PDDeployment's watch event (not its deletion): reconcile it if its spec is new to the
        runner (see the module doc)."""
        key = (namespace, name)
        self.track(namespace, name)
        if key in self._generations and self._generations[key] == generation:
            return
        self._generations[key] = generation
        self._new_spec.add(key)
        self.poke(namespace, name, SPEC_TRIGGERS.get(event_type, "update"), delay=0.0)

    def track(self, namespace: str, name: str) -> None:
        self._last_run.setdefault((namespace, name), time.monotonic())

    def forget(self, namespace: str, name: str) -> None:
        self._last_run.pop((namespace, name), None)
        self._locks.pop((namespace, name), None)
        self._written.pop((namespace, name), None)
        self._failed.pop((namespace, name), None)
        self._deleted.pop((namespace, name), None)
        self._generations.pop((namespace, name), None)
        self._new_spec.discard((namespace, name))
        self._retries.pop((namespace, name), None)
        for k in [k for k in self._event_at if k[0] == (namespace, name)]:
            del self._event_at[k]
        self.metrics.forget(namespace, name)

    def poke(self, namespace: str, name: str, trigger: str = "child", delay: float | None = None) -> None:
        """Schedule a reconcile after `delay` (default: the debounce); pokes arriving before it starts
        are folded into it."""
        key = (namespace, name)
        if key in self._pending:
            return
        self._pending.add(key)
        task = asyncio.get_running_loop().create_task(
            self._poked(key, trigger, self.debounce_s if delay is None else delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _poked(self, key: ObjKey, trigger: str, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self.run(*key, trigger=trigger)
        except InvalidSpec:
            self._retries.pop(key, None)  # recorded in the status; nothing to retry until the spec changes
            return
        except ApiError as err:
            retry = self._retries.get(key, 0)
            self._retries[key] = retry + 1
            wait = RETRY_DELAYS[min(retry, len(RETRY_DELAYS) - 1)]
            if err.temporary:
                asyncio.get_running_loop().call_later(wait, self.poke, *key, "retry")
            logger.warning("Reconcile of %s/%s failed (%s); %s", *key, err,
                           f"retrying in {wait} s" if err.temporary else "the drift loop retries",
                           extra={"object": f"{key[0]}/{key[1]}"})
            return
        self._retries.pop(key, None)

    async def drift(self) -> None:
        """Forever: reconcile every known object that nothing reconciled for a drift interval."""
        while True:
            await asyncio.sleep(min(self.drift_interval_s / 3, 10.0))
            now = time.monotonic()
            for key, last in list(self._last_run.items()):
                if now - last >= self.drift_interval_s:
                    self._last_run[key] = now
                    self.poke(*key, trigger="drift")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)


def _version(obj: dict | None) -> str | None:
    return None if obj is None else (obj.get("metadata") or {}).get("resourceVersion")

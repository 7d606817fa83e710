"""The kopf handlers: thin triggers of the one reconcile (see runner.py), and the webhook's health
(the webhook itself is served apart from kopf: webhook.py).
Every handler of PDDeployments and their children is an event handler: kopf keeps no per-object
state for them (on.create/on.update would store their progress and the last-handled spec in
annotations on the user's PDDeployment, one more write and admission call per spec change).

Handlers are registered into a registry passed in (not kopf's global one), so several operators
can run in one process (tests, the demo) and importing this module has no side effects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf

from pd_operator.api.labels import DEPLOYMENT, RECORDED_REVISION
from pd_operator.api.types import GROUP, PLURAL, VERSION
from pd_operator.controller.runner import Runner, index_id, tree_copy
from pd_operator.controller.webhook import WebhookHealth
from pd_operator.render.kinds import CHILD_RESOURCES

OWNED: list[tuple[str, str, str]] = [*CHILD_RESOURCES, ("", "v1", "pods")]
"""(group, version, plural) of what the operator creates or its workloads do: watched and indexed
only where labelled with a PDDeployment (DEPLOYMENT)."""
RECORDS = ("apps", "controllerrevisions")
"""(group, plural) of the instances' revision records: watched only where RECORDED_REVISION says ours."""


def watch_only_ours(settings: kopf.OperatorSettings) -> None:
    """Ask the API server for labelled objects only when listing and watching OWNED kinds: RBAC
    cannot limit a list to our objects, so without the selector every ConfigMap, Pod, Role and
    Service of the cluster would reach the operator's memory and the handlers' filter would drop
    them there (kopf sends `labelSelector` from settings.watching.label_selectors, kopf 1.45
    _cogs/clients/watching.py)."""
    owned = {(group, plural) for group, _, plural in OWNED}
    selector = DEPLOYMENT  # the label's key alone: "has the label"
    settings.watching.label_selectors[lambda resource: (resource.group, resource.plural) in owned] = selector
    # The StatefulSet controller's own ControllerRevisions carry the pod template's labels, ours among
    # them: only the operator's records (controller/revisions.py) carry this one too (kopf joins the
    # selectors that apply to a resource).
    settings.watching.label_selectors[lambda resource: (resource.group, resource.plural) == RECORDS] = \
        RECORDED_REVISION


async def by_owner(*, namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any], **_: Any
                   ) -> dict:
    """The index entry of a watched child or pod: a copy of its own (kopf reuses the event's body),
    by its owner's key. Without managedFields: nothing reads them, and they are up to half of an
    applied object, so leaving them out before the copy halves its cost. A coroutine, so kopf calls
    it in its event loop: a plain function it would hand to a thread on every watch event (kopf 1.45
    _core/actions/invocation.py `invoke`), to wait there for the GIL behind the reconcile threads."""
    meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    return {(namespace, labels[DEPLOYMENT]): tree_copy({**body, "metadata": meta})}


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, for a registry of event handlers only. kopf builds it on every watch event
    from a deep copy of the whole object (status included) and diffs it with the last stored one
    (kopf 1.45 _core/reactor/processing.py `_detect_causes`), yet only changing handlers
    (on.create/update/resume/field) read it and this operator has none: that was 7-9% of the
    operator's Python CPU with 100 PDDeployments (docs/benchmarks.md#reconcile-cost). This one
    builds an empty essence and stores nothing
    (tests/controller/test_main.py: `register` adds no changing handler)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def register(registry: kopf.OperatorRegistry, runner: Runner, *, webhook: WebhookHealth | None) -> None:
    """`webhook`: serve the admission webhook and report its state in /healthz (None: no webhook)."""
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        config = runner.client.api.configuration
        header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
            "authorization")
        scheme, _sep, token = (header or "").rpartition(" ")
        return kopf.ConnectionInfo(server=config.host, ca_path=config.ssl_ca_cert,
                                   insecure=not config.verify_ssl, scheme=scheme or None,
                                   token=token or None, certificate_path=config.cert_file,
                                   private_key_path=config.key_file)

    @kopf.on.startup(registry=registry)
    async def start_drift(memo: kopf.Memo, **_: Any) -> None:
        memo["drift"] = asyncio.get_running_loop().create_task(runner.drift())

    @kopf.on.cleanup(registry=registry)
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        memo["drift"].cancel()
        await runner.close()

    # Index names: the plural, with its group where two kinds share one (the two PodGroups).
    shared = {plural for _, _, plural in OWNED if sum(p == plural for _, _, p in OWNED) > 1}
    plurals = [f"{plural}.{group}" if plural in shared else plural for group, _, plural in OWNED]

    @kopf.on.event(*resource, registry=registry)
    async def follow_pdd(*, type: str | None, namespace: str | None, name: str, body: kopf.Body,
                         **kw: Any) -> None:
        runner.use_indexes(plurals, kw)
        if type == "DELETED":
            runner.forget(namespace or "", name)
        else:
            runner.spec_event(namespace or "", name, type, body.metadata.get("generation"))

    async def poke_owner(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                         **kw: Any) -> None:
        runner.use_indexes(plurals, kw)
        owner = (namespace or "", labels[DEPLOYMENT])
        if body.get("kind") == "Pod":  # the runner remembers failed pods (runner.py)
            runner.child_event(owner, dict(body))
        else:
            runner.child_event(owner, {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                                       "metadata": {"name": body.metadata.name,
                                                    "resourceVersion": body.metadata.get("resourceVersion")}})

    for (group, version, plural), name in zip(OWNED, plurals, strict=True):
        only_ours = {DEPLOYMENT: kopf.PRESENT}
        if (group, plural) == RECORDS:
            only_ours[RECORDED_REVISION] = kopf.PRESENT
        kopf.index(group, version, plural, labels=only_ours, registry=registry, id=index_id(name))(by_owner)
        kopf.on.event(group, version, plural, labels=only_ours, registry=registry,
                      id=f"child-{name}")(poke_owner)

    if webhook is not None:
        @kopf.on.probe(id="webhook", registry=registry)
        def webhook_health(**_: Any) -> dict[str, Any]:
            return webhook.report()


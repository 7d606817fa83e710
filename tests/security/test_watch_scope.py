"""The excess: RBAC cannot limit a list to the operator's own objects, so a cluster-wide operator that
lists and watches ConfigMaps, Pods, Roles and Services without a selector receives every tenant's
objects (a ConfigMap with another team's configuration, every pod's spec and env) and only drops them
in its handlers. The operator asks the API server for labelled objects only (the cluster tier's
test_helm_install checks the requests in the audit log)."""

from __future__ import annotations

import pytest
from kopf._cogs.structs.references import Resource

from pd_operator.api.labels import DEPLOYMENT, RECORDED_REVISION
from pd_operator.api.types import GROUP, PLURAL, VERSION
from pd_operator.controller.handlers import OWNED, RECORDS
from pd_operator.controller.main import options_from, settings_for

pytestmark = pytest.mark.security


def _selectors(resource: Resource) -> list[str]:
    settings = settings_for(options_from(["run", "--no-webhook"]))
    return list(settings.watching.label_selectors.collect(resource))


@pytest.mark.parametrize(("group", "version", "plural"), OWNED,
                         ids=[f"{g or 'core'}/{p}" for g, _, p in OWNED])
def test_a_tenants_objects_never_reach_the_operator(group, version, plural):
    resource = Resource(group, version, plural, namespaced=True)
    # ControllerRevisions: only the operator's own records, not the StatefulSet controller's (which
    # carry the pod template's labels, ours among them).
    want = [DEPLOYMENT, RECORDED_REVISION] if (group, plural) == RECORDS else [DEPLOYMENT]
    assert _selectors(resource) == want, f"{plural} are listed and watched unfiltered"


@pytest.mark.parametrize("resource", [
    Resource(GROUP, VERSION, PLURAL, namespaced=True),  # authored by users: no label of ours
    Resource("", "v1", "namespaces", namespaced=False),
    Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False),
    Resource("", "v1", "secrets", namespaced=True)], ids=lambda r: r.plural)
def test_what_is_not_ours_by_label_is_not_filtered_by_it(resource):
    assert _selectors(resource) == []

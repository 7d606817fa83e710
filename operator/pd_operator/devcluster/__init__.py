"""An in-process emulated Kubernetes API server for integration tests and demos.

Built on kmock 0.8 (``KubernetesEmulator``: server plumbing, DSL routing, discovery scaffolding,
error rendering, bundled built-in resource catalog), with the gaps that matter to an operator
closed by a thin layer of our own:

==========================================  =====================================================
kmock 0.8 gap                               closed by
==========================================  =====================================================
no uid/resourceVersion/generation/          ``store.Store`` (global RV counter, generation rules,
creationTimestamp                           creationTimestamp, managedFields manager names)
watch replays everything, ignores RV        ``Store.watch`` event log: resume after RV, 410 when
                                            compacted; ``sendInitialEvents`` + bookmark
label/field selectors ignored               ``selectors`` (list, watch, deletecollection)
no ownerReference GC                        ``Store._collect_dependents`` (background, Orphan)
``/status`` not isolated                    ``Store._update`` status/main split per subresource
SSA accepted but ignored                    ``patching`` (apply = strategic merge, creates)
PATCH flavours all merged alike             ``patching`` (merge, json-patch w/ test, strategic)
PUT 404                                     ``ApiHandler._serve_replace`` (409 on stale RV)
POST 200 (not 201); dup POST reason         ``ApiHandler._serve_create``; 409 AlreadyExists
``GET /api/v1/namespaces`` 500              ``server.parse_path``
core discovery ``groupVersion: "/v1"``      ``ApiHandler._serve_version``
``/api`` lacks serverAddressByClientCIDRs   ``ApiHandler._serve_api`` (the client requires it)
list answers ``resourceVersion: "..."``     real counter; items sorted by namespace/name
json-patch ``test`` failure not a 422       ``patching.json_patch`` (kopf relies on the 422)
state only reachable in the server loop     thread-safe direct API on ``DevCluster``
global aiohttp DNS patch in kmock.Server    ``DevCluster`` uses ``RawTestServer`` directly
==========================================  =====================================================

Gaps left (documented in the modules): no admission/validation/defaulting (except Pod/Namespace
phase), no schema pruning, no field-ownership conflicts in SSA, no ``$retainKeys`` /
``$setElementOrder`` in strategic merge, no pagination, no dry-run, no subresources but
``/status``, no periodic watch bookmarks, Foreground deletion acts as Background, namespaces are
deleted at once (no Terminating phase), PUT never creates, the preferred version of a
multi-version CRD group is arbitrary, no authn/authz (any token is accepted).

Usage::

    with DevCluster(crd_paths=["crds/x.yaml"]) as cluster:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=cluster.kubeconfig_path, client_configuration=config)
        cluster.run_workload_controllers()  # optional: StatefulSet/Deployment pods and status
        ...

Pointing kopf at it: either ``@kopf.on.login()`` returning
``kopf.ConnectionInfo(server=cluster.url, insecure=True)``, or ``kopf.login_via_client(**kwargs)``
with the kubeconfig made the client's default -- the ``kubernetes`` package reads ``$KUBECONFIG``
once at import, so set it before importing, or patch
``kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION`` (see tests/devcluster/test_kopf.py).
Run kopf with ``--standalone`` (no peering CRDs are served unless you register them).
"""

from .cluster import DevCluster
from .faults import FaultInjector
from .records import RequestLog, RequestRecord

__all__ = ["DevCluster", "FaultInjector", "RequestLog", "RequestRecord"]

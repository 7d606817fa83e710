"""pd-proxy's membership watch (proxy/watch.py) against the real control plane (kube-apiserver
v1.36.3), with the ServiceAccount, Role and RoleBinding the operator renders for it
(render/proxy_access.py) and a TokenRequest token of that ServiceAccount:
- the proxy routes by each version of its ConfigMap as the API server sends it, with no file at all;
- it reads the ConfigMap by list and watch with a `metadata.name` field selector, which the Role's
  resourceNames allow (nothing is refused, and nothing else is read);
- a cut watch is resumed, a watch answered 410 Gone is followed by a new list, and the watch comes
  back after the API server restarts;
- without a token, or while RBAC refuses the watch, the mounted file is what it routes by; once the
  watch works, the ConfigMap is.
The API server is reached through support/faultproxy.py, which cuts watches and injects the 410.
Only conditions are waited for (ProxyProcess.wait_version); nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pd_operator.proxy.membership import KEY, Upstream, document
from pd_operator.proxy.watch import CA, NAMESPACE, TOKEN
from pd_operator.render import proxy
from pd_operator.render.kinds import CHILD_KINDS
from pd_operator.render.proxy_access import proxy_access
from pd_operator.spec.validate import Resolved
from support.cluster import ApiError, ControlPlane, service_account_user, wait_for
from support.fakevllm import ProxyProcess, project, until
from support.faultproxy import FaultProxy
from support.podnet import api_env, membership_sources
from support.specs import example, resolve

pytestmark = pytest.mark.integration

LAYOUT = resolve(example()).layout_hash
"""The example's kv-layout hash (the namespace does not change it)."""
_INSTANCES = [({0}, {0}), ({0}, {0, 1}), ({0, 1}, {0, 1}), ({1}, {0, 1}), ({1}, {1}), ({0}, {1})]
ROUTABLE = [{"prefill": dict.fromkeys(p, LAYOUT), "decode": dict.fromkeys(d, LAYOUT)} for p, d in _INSTANCES]
"""Memberships to switch between (instances on one layout): each a different version."""


def _path(api_version: str, plural: str, namespace: str) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}"


class Setup:
    """One PDDeployment's proxy identity and membership ConfigMap in `namespace`, rendered as the
    operator renders them, and a proxy process outside any pod using them."""

    def __init__(self, cp: ControlPlane, namespace: str, workdir: Path) -> None:
        self.cp, self.namespace, self.workdir = cp, namespace, workdir
        self.ctx: Resolved = resolve(example(namespace=namespace))
        self.name = self.ctx.names.proxy_membership
        self.account = self.ctx.names.proxy_access
        self.credentials = workdir / "serviceaccount"
        self.file = workdir / "membership" / KEY
        self.file.parent.mkdir()

    def create(self, *kinds: str) -> None:
        for manifest in proxy_access(self.ctx):
            if manifest["kind"] in kinds:
                plural = CHILD_KINDS[(manifest["apiVersion"], manifest["kind"])]
                self.cp.api("POST", _path(manifest["apiVersion"], plural, self.namespace), manifest)

    def config_map(self, i: int) -> str:
        """Write membership ROUTABLE[i] into the ConfigMap (created on first use); its version."""
        cm = proxy.membership_config_map(self.ctx, ROUTABLE[i])
        path = f"{_path('v1', 'configmaps', self.namespace)}"
        if self.cp.find(f"{path}/{self.name}") is None:
            self.cp.api("POST", path, cm)
        else:
            self.cp.api("PATCH", f"{path}/{self.name}", {"data": cm["data"]},
                        content_type="application/merge-patch+json")
        return str(proxy.membership_document(self.ctx, ROUTABLE[i])["version"])

    def project_file(self, i: int) -> str:
        """Write membership ROUTABLE[i] as the mounted file; its version."""
        doc = proxy.membership_document(self.ctx, ROUTABLE[i])
        project(self.file, proxy.membership_data(doc)[KEY])
        return str(doc["version"])

    def credentials_dir(self, *, token: bool = True) -> None:
        """The pod's ServiceAccount volume: token, ca.crt, namespace (no token: automount off)."""
        self.credentials.mkdir(exist_ok=True)
        (self.credentials / CA).write_bytes(self.cp.ca_cert.read_bytes())
        (self.credentials / NAMESPACE).write_text(self.namespace)
        if token:
            (self.credentials / TOKEN).write_text(self.cp.service_account_token(self.namespace, self.account))

    def process(self, api_port: int) -> ProxyProcess:
        return ProxyProcess.on_loopback(self.file, self.workdir / "proxy.log", "--membership-configmap",
                                        self.name, "--service-account-dir", str(self.credentials),
                                        env=api_env(api_port))

    def sources(self) -> list[str]:
        return membership_sources(self.workdir / "proxy.log")


def test_the_proxy_follows_its_config_map_through_cut_watches_and_410(control_plane, namespace, tmp_path,
                                                                      fault_proxy: FaultProxy):
    cp, s = control_plane, Setup(control_plane, namespace, tmp_path)
    s.create("ServiceAccount", "Role", "RoleBinding")
    s.credentials_dir()
    first = s.config_map(0)
    mark = cp.audit.mark()

    async def scenario() -> None:
        async with s.process(fault_proxy.port) as p:
            await p.wait_version(first)  # the list: there is no file
            await p.wait_version(s.config_map(1))  # a watch event
            await holds("a watch through the fault proxy", lambda: fault_proxy.open_watches(namespace) >= 1)
            assert fault_proxy.cut_watches() >= 1
            await p.wait_version(s.config_map(2))
            # An ERROR event with 410 on the next watch: the proxy lists again.
            # The proxy lists and watches again after the cut: cut the new watch once it is open.
            await holds("the watch back", lambda: fault_proxy.open_watches(namespace) >= 1)
            rule = fault_proxy.inject(verb="watch", resource="configmaps", namespace=namespace, status=410)
            assert fault_proxy.cut_watches() >= 1
            await holds("the 410", lambda: rule.hits == 1)
            await p.wait_version(s.config_map(3))

    asyncio.run(scenario())
    reads = [r for r in fault_proxy.requests if r.namespace == namespace and r.resource == "configmaps"]
    expired = next(i for i, r in enumerate(reads) if r.fault == "status 410")
    assert any(r.verb == "list" for r in reads[expired:]), [str(r) for r in reads]
    assert not s.file.exists()
    assert set(s.sources()) == {f"ConfigMap {namespace}/{s.name} (watched)"}
    user = service_account_user(namespace, s.account)
    assert not cp.audit.forbidden(mark, user=user)
    asked = {(e.verb, e.resource, e.name) for e in cp.audit.events(mark, user=user)}
    assert asked == {("list", "configmaps", s.name), ("watch", "configmaps", s.name)}, asked


def test_without_a_token_or_while_rbac_refuses_the_file_is_the_membership(control_plane, namespace, tmp_path):
    cp, s = control_plane, Setup(control_plane, namespace, tmp_path)
    s.create("ServiceAccount", "Role")
    s.config_map(0)

    async def no_token() -> None:
        s.credentials_dir(token=False)
        async with s.process(cp.port) as p:
            await p.wait_version(s.project_file(1))
            await p.wait_version(s.project_file(2))
        assert "membership from the file only" in (tmp_path / "proxy.log").read_text()

    async def refused_then_bound() -> None:
        s.credentials_dir()  # a token, but no RoleBinding yet: 403
        async with s.process(cp.port) as p:
            await p.wait_version(s.project_file(3))
            await holds("the watch refused", lambda: "HTTP 403" in (tmp_path / "proxy.log").read_text())
            await p.wait_version(s.project_file(4))  # the watch is down: file changes count
            s.create("RoleBinding")
            await p.wait_version(s.config_map(5))  # the watch is back: the ConfigMap counts

    asyncio.run(no_token())
    assert set(s.sources()) == {f"membership file {s.file}"}
    asyncio.run(refused_then_bound())
    assert s.sources()[-1] == f"ConfigMap {namespace}/{s.name} (watched)"


def test_the_watch_comes_back_after_the_api_server_restarts(fresh_control_plane, tmp_path):
    cp, namespace = fresh_control_plane, "watch"
    cp.create_namespace(namespace)
    s = Setup(cp, namespace, tmp_path)
    s.create("ServiceAccount", "Role", "RoleBinding")
    s.credentials_dir()
    apiserver = cp.components["kube-apiserver"]

    async def scenario() -> None:
        async with s.process(cp.port) as p:
            await p.wait_version(s.config_map(0))
            apiserver.stop()
            apiserver.start()
            await asyncio.to_thread(wait_for, "kube-apiserver back", lambda: _answers(cp, namespace))
            await p.wait_version(s.config_map(1))

    asyncio.run(scenario())
    log = (tmp_path / "proxy.log").read_text()
    assert "the watch is back" in log, log[-3000:]


def _answers(cp: ControlPlane, namespace: str) -> bool:
    try:
        return cp.exists(f"/api/v1/namespaces/{namespace}")
    except (ApiError, OSError):
        return False


async def holds(what: str, check: Callable[[], bool]) -> None:
    await until(what, check)


def test_a_config_map_the_proxy_cannot_parse_never_stops_its_watch(control_plane, namespace, tmp_path):
    """Attack: whoever can write the ConfigMap puts JSON nested too deeply for the parser (or an entry
    outside the deployment's addresses) in it; the watch must go on, so the next good version is
    applied as it is written (before issue 34 the exception killed the watch task while the proxy
    still reported live, and membership froze)."""
    cp, s = control_plane, Setup(control_plane, namespace, tmp_path)
    s.create("ServiceAccount", "Role", "RoleBinding")
    s.credentials_dir()
    first = s.config_map(0)
    path = f"{_path('v1', 'configmaps', namespace)}/{s.name}"
    doc = proxy.membership_document(s.ctx, ROUTABLE[1])
    forged = {**doc, "decode": [{**doc["decode"][0], "url": "http://attacker.example:8000"}]}
    lists = ([Upstream(e["name"], e["url"], e.get("layout", "")) for e in forged[role]]
             for role in ("prefill", "decode"))
    forged["version"] = document(*lists)["version"]

    def write(text: str) -> None:
        cp.api("PATCH", path, {"data": {KEY: text}}, content_type="application/merge-patch+json")

    async def scenario() -> None:
        identity = ["--deployment", s.ctx.deployment.name, "--namespace", namespace, "--serving-port",
                    str(s.ctx.deployment.spec.serving_port)]
        async with ProxyProcess.on_loopback(s.file, tmp_path / "proxy.log", "--membership-configmap", s.name,
                                            "--service-account-dir", str(s.credentials), *identity,
                                            env=api_env(cp.port)) as p:
            await p.wait_version(first)
            for bad in ("[" * 200_000 + "]" * 200_000, json.dumps(forged)):
                before = p.log.read_text().count("is malformed")
                write(bad)
                await until("the proxy to refuse it",
                            lambda b=before: p.log.read_text().count("is malformed") > b)
                assert (await p.state()).version == first
            await p.wait_version(s.config_map(2))  # the watch still runs

    asyncio.run(scenario())

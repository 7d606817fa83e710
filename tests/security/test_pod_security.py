"""Every rendered pod, of every example and of generated valid specs: not privileged, no privilege
escalation, no capabilities (every container drops ALL, the engine's too), seccomp
RuntimeDefault, no API token unless the pod names a ServiceAccount of its own, the proxy non-root
on a read-only root, no host PID/IPC, no host port, host paths read-only, and the host network only
when the spec asks for it and the admin allows it (spec/node_access.py), which the validator then reports
(HostNetwork)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings

from pd_operator.render.runnable import validate
from pd_operator.spec.node_access import NodeAccess
from support.rendered_pods import pod_specs, validated_render
from support.renders import VALID_EXAMPLES
from support.spec_strategies import deployments
from support.specs import example


def pod_problems(name: str, pod: dict) -> list[str]:
    out = []
    if pod.get("hostPID") or pod.get("hostIPC"):
        out.append(f"{name}: shares the host PID or IPC namespace")
    if (pod.get("securityContext") or {}).get("seccompProfile") != {"type": "RuntimeDefault"}:
        out.append(f"{name}: no RuntimeDefault seccomp profile")
    if "serviceAccountName" not in pod and pod.get("automountServiceAccountToken") is not False:
        out.append(f"{name}: mounts the namespace's default ServiceAccount token")
    proxy = any(c["name"] == "proxy" for c in pod["containers"])
    if proxy and not (pod.get("securityContext") or {}).get("runAsNonRoot"):
        out.append(f"{name}: the proxy pod may run as root")
    host_paths = {v["name"] for v in pod.get("volumes", []) if "hostPath" in v}
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        ctx = c.get("securityContext") or {}
        if ctx.get("privileged") is not False:
            out.append(f"{name}/{c['name']}: privileged is not false")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}/{c['name']}: allowPrivilegeEscalation is not false")
        if (ctx.get("capabilities") or {}).get("add"):
            out.append(f"{name}/{c['name']}: adds capabilities")
        if (ctx.get("capabilities") or {}).get("drop") != ["ALL"]:
            out.append(f"{name}/{c['name']}: keeps capabilities")
        if [p for p in c.get("ports", []) if "hostPort" in p] and not pod.get("hostNetwork"):
            out.append(f"{name}/{c['name']}: binds a host port")
        if c["name"] == "proxy" and not (ctx.get("runAsNonRoot") and ctx.get("readOnlyRootFilesystem")):
            out.append(f"{name}/{c['name']}: may run as root or write its root file system")
        for mount in c.get("volumeMounts", []):
            if mount["name"] in host_paths and not mount.get("readOnly"):
                out.append(f"{name}/{c['name']}: host path {mount['mountPath']} is writable")
    return out


HOST_NETWORK_ALLOWED = NodeAccess(host_network=True)


def check(doc: dict) -> None:
    validation, manifests = validated_render(doc, node_access=HOST_NETWORK_ALLOWED)
    asked = {role for role in ("prefill", "decode") if validation.deployment.role(role).host_network}
    warned = {f.path.split(".")[1] for f in validation.warnings if f.code == "HostNetwork"}
    assert warned == asked
    problems = []
    for name, pod in pod_specs(manifests):
        problems += pod_problems(name, pod)
        role = next((m["metadata"]["labels"].get("pd.serving.dev/role") for m in manifests
                     if m["metadata"]["name"] == name and m["kind"] in ("StatefulSet", "Deployment")), None)
        if bool(pod.get("hostNetwork")) != (role in asked):
            problems.append(f"{name}: hostNetwork {pod.get('hostNetwork')}, asked by {sorted(asked)}")
    assert not problems, problems


def test_the_checker_sees_each_problem():
    bad = {"hostPID": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
           "containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}},
                           "ports": [{"containerPort": 80, "hostPort": 80}],
                           "volumeMounts": [{"name": "h", "mountPath": "/host"}]}]}
    # host PID, seccomp, token, privileged, escalation, added capability, kept ones, host port, host path
    assert len(pod_problems("bad", bad)) == 9
    proxy = {"automountServiceAccountToken": False,
             "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
             "containers": [{"name": "proxy", "securityContext": {
                 "privileged": False, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
    assert len(pod_problems("proxy", proxy)) == 2  # the pod and the container may run as root
    own_account = {**proxy, "serviceAccountName": "watcher"}
    del own_account["automountServiceAccountToken"]
    assert pod_problems("proxy", own_account) == pod_problems("proxy", proxy)  # a token it was given


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_example_pods_are_unprivileged(path):
    check(example(path))


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_host_network_only_on_request_and_reported(role):
    doc = example(VALID_EXAMPLES[0])
    doc["spec"][role]["hostNetwork"] = True
    check(doc)
    warnings = validate(doc, node_access=HOST_NETWORK_ALLOWED).warnings
    assert any(f.code == "HostNetwork" and f.path == f"spec.{role}.hostNetwork" for f in warnings)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(deployments())
def test_generated_spec_pods_are_unprivileged(doc):
    assume(validate(doc, node_access=HOST_NETWORK_ALLOWED).ok)
    check(doc)

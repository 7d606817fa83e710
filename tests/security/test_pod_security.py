"""Every rendered pod, of every example and of generated valid specs: not privileged, no privilege
escalation, no added capabilities, no host PID/IPC, host paths read-only, and the host network
only when the spec asks for it, which the validator then reports (HostNetwork)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings

from pd_operator.spec.validate import validate
from support.rendered_pods import pod_specs, validated_render
from support.renders import VALID_EXAMPLES
from support.spec_strategies import deployments
from support.specs import example


def pod_problems(name: str, pod: dict) -> list[str]:
    out = []
    if pod.get("hostPID") or pod.get("hostIPC"):
        out.append(f"{name}: shares the host PID or IPC namespace")
    host_paths = {v["name"] for v in pod.get("volumes", []) if "hostPath" in v}
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        ctx = c.get("securityContext") or {}
        if ctx.get("privileged") is not False:
            out.append(f"{name}/{c['name']}: privileged is not false")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}/{c['name']}: allowPrivilegeEscalation is not false")
        if (ctx.get("capabilities") or {}).get("add"):
            out.append(f"{name}/{c['name']}: adds capabilities")
        for mount in c.get("volumeMounts", []):
            if mount["name"] in host_paths and not mount.get("readOnly"):
                out.append(f"{name}/{c['name']}: host path {mount['mountPath']} is writable")
    return out


def check(doc: dict) -> None:
    validation, manifests = validated_render(doc)
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
                           "volumeMounts": [{"name": "h", "mountPath": "/host"}]}]}
    assert len(pod_problems("bad", bad)) == 5  # host PID, privileged, escalation, capability, host path


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_example_pods_are_unprivileged(path):
    check(example(path))


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_host_network_only_on_request_and_reported(role):
    doc = example(VALID_EXAMPLES[0])
    doc["spec"][role]["hostNetwork"] = True
    check(doc)
    warnings = validate(doc).warnings
    assert any(f.code == "HostNetwork" and f.path == f"spec.{role}.hostNetwork" for f in warnings)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(deployments())
def test_generated_spec_pods_are_unprivileged(doc):
    assume(validate(doc).ok)
    check(doc)

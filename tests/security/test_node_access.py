"""What an author who may create a PDDeployment can take of the nodes, tried as a hostile tenant would:
each attack is a manifest, refused at its field path by every door that validates (pdctl, the
admission verdict, the validator the controller calls) unless the cluster admin started the operator
with the option that allows it (the chart's values -> `pd-operator run` flags), with which it
validates. And what the admin's options change: namespaced host paths, images always pulled, and a
running PDDeployment the new rules refuse keeping its children (an upgrade keeps serving)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from pd_operator import cli
from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.controller.admission import verdict
from pd_operator.controller.main import options_from
from pd_operator.controller.proxy_state import ProxyStateReader
from pd_operator.render import render
from pd_operator.render.runnable import validate
from pd_operator.spec.host_paths import DEFAULT as DEFAULT_HOST_PATHS
from pd_operator.spec.host_paths import HostPathPolicy
from pd_operator.spec.node_access import NodeAccess
from support.controller_fakes import OWNER_UID, desired
from support.helm_chart import operator_args, template
from support.rendered_pods import pod_specs
from support.specs import SNIFFER_FIELDS, example, sniffer

pytestmark = pytest.mark.security

EVERYTHING = NodeAccess(host_network=True, control_plane_tolerations=True, host_path_creation=True)
NODE_ACCESS_CODES = {"HostNetworkNotAllowed", "TolerationNotAllowed", "HostPathCreationNotAllowed"}
NONE_ALLOWED = NodeAccess()


def node_access_errors(doc: dict, access: NodeAccess = NONE_ALLOWED, **options: Any) -> dict[str, str]:
    return {f.path: f.code for f in validate(doc, node_access=access, **options).errors
            if f.code in NODE_ACCESS_CODES}


def test_the_sniffer_is_refused_at_every_field_by_every_door(tmp_path, capsys):
    doc = sniffer()
    assert node_access_errors(doc) == SNIFFER_FIELDS
    assert validate(doc).resolved is None  # the controller renders nothing for it
    v = verdict(doc, "CREATE")
    assert not v.allowed
    for field in SNIFFER_FIELDS:
        assert f"{field}: " in v.message, (field, v.message)
    assert "--allow-host-network" in v.message and "nodeAccess.hostNetwork" in v.message
    path = tmp_path / "sniffer.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", str(path)]) == cli.EXIT_FINDINGS
    out = capsys.readouterr().out
    for field, code in SNIFFER_FIELDS.items():
        assert f"{code} at {field}" in out, out


def test_with_the_admins_options_it_validates(tmp_path, capsys):
    doc = sniffer()
    assert validate(doc, node_access=EVERYTHING).ok
    assert verdict(doc, "CREATE", node_access=EVERYTHING).allowed
    path = tmp_path / "sniffer.yaml"
    path.write_text(yaml.safe_dump(doc))
    flags = ["--allow-host-network", "--allow-control-plane-tolerations", "--allow-host-path-creation"]
    assert cli.main(["validate", str(path), *flags]) == cli.EXIT_OK
    # Each option allows its own field only.
    for flag, field in zip(flags, SNIFFER_FIELDS, strict=True):
        capsys.readouterr()
        assert cli.main(["validate", str(path), flag]) == cli.EXIT_FINDINGS
        out = capsys.readouterr().out
        assert f"{SNIFFER_FIELDS[field]} at {field}:" not in out
        assert all(f"{code} at {f}:" in out for f, code in SNIFFER_FIELDS.items() if f != field), out
    # The host network the admin allows is still reported: no NetworkPolicy isolates those pods.
    assert [f.path for f in validate(doc, node_access=EVERYTHING).warnings if f.code == "HostNetwork"] == [
        "spec.decode.hostNetwork"]


@pytest.mark.parametrize("toleration", [
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node-role.kubernetes.io/master", "operator": "Exists"},
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "", "effect": "NoExecute"},
    {"operator": "Exists"},
    {"operator": "Exists", "effect": "NoSchedule"},
    {"key": "", "operator": "Exists", "effect": "NoExecute"},
])
def test_tolerations_that_reach_the_control_plane_are_refused(toleration):
    doc = example()
    doc["spec"]["prefill"]["tolerations"] = [toleration]
    assert node_access_errors(doc) == {"spec.prefill.tolerations[0]": "TolerationNotAllowed"}
    assert node_access_errors(doc, NodeAccess(control_plane_tolerations=True)) == {}


def test_the_npu_nodes_own_taints_may_be_tolerated():
    doc = example("deepseek-v3.2-multinode-decode.yaml")  # tolerates huawei.com/ascend-1980
    assert doc["spec"]["decode"]["tolerations"] and validate(doc).ok


@pytest.mark.parametrize("kind", ["DirectoryOrCreate", "FileOrCreate", ""])
def test_host_mounts_that_create_on_the_node_are_refused(kind):
    doc = example()
    mount = {"path": "/data/other-team/models", **({"type": kind} if kind else {})}
    doc["spec"]["prefill"]["hostMounts"] = {"generation": "A3", "paths": [mount]}
    assert node_access_errors(doc) == {"spec.prefill.hostMounts.paths[0].type": "HostPathCreationNotAllowed"}
    assert node_access_errors(doc, NodeAccess(host_path_creation=True)) == {}
    doc["spec"]["prefill"]["hostMounts"]["paths"][0]["type"] = "Directory"
    assert node_access_errors(doc) == {}


def test_a_host_port_has_no_field_but_the_host_network():
    doc = example()
    doc["spec"]["decode"]["hostPort"] = 8000
    errors = validate(doc).errors
    assert errors and all(f.code == "InvalidSpec" for f in errors)
    assert any(f.path.startswith("spec.decode") and "hostPort" in f.path + f.message for f in errors), errors


def test_host_paths_scoped_to_the_namespace_keep_teams_apart():
    scoped = HostPathPolicy.of([*DEFAULT_HOST_PATHS.allowed[:-1], "/data/{namespace}"])

    def errors(namespace: str, weights: str) -> dict[str, str]:
        doc = example("deepseek-v3.2-multinode-decode.yaml")
        doc["metadata"]["namespace"] = namespace
        doc["spec"]["model"]["weights"]["hostPath"]["path"] = weights
        return {f.path: f.code for f in validate(doc, host_path_policy=scoped).errors}

    assert errors("team-a", "/data/team-a/models") == {}
    refused = {"spec.model.weights.hostPath.path": "HostPathNotAllowed"}
    assert errors("team-a", "/data/team-b/models") == refused
    assert errors("team-a", "/data/team-a-x") == refused
    assert errors("team-a", "/data") == refused
    # A namespace cannot carry a protected path in: the path itself is checked first.
    root = HostPathPolicy.of(["/{namespace}"])
    doc = example("deepseek-v3.2-multinode-decode.yaml")
    doc["metadata"]["namespace"] = "proc"
    doc["spec"]["model"]["weights"]["hostPath"]["path"] = "/proc/models"
    assert {f.code for f in validate(doc, host_path_policy=root).errors} >= {"HostPathProtected"}
    with pytest.raises(ValueError, match="braces"):
        HostPathPolicy.of(["/data/{name}"])


def test_the_operator_and_pdctl_take_the_namespaced_entry(tmp_path, capsys):
    options = options_from(["run", "--no-webhook", "--allow-host-path=/data/{namespace}"])
    assert options.host_path_policy.allowed == ("/data/{namespace}",)
    doc = example("deepseek-v3.2-multinode-decode.yaml")
    doc["metadata"]["namespace"] = "team-a"
    doc["spec"]["model"]["weights"]["hostPath"]["path"] = "/data/team-b/models"
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(doc))
    defaults = [f"--allow-host-path={p}" for p in DEFAULT_HOST_PATHS.allowed[:-1]]
    scoped = "--allow-host-path=/data/{namespace}"
    assert cli.main(["validate", str(path), *defaults, scoped]) == cli.EXIT_FINDINGS
    assert "HostPathNotAllowed at spec.model.weights.hostPath.path" in capsys.readouterr().out


def test_a_cached_private_image_is_pulled_again_when_the_admin_forces_it():
    doc = example()
    doc["spec"]["image"]["pullPolicy"] = "Never"  # run whatever the node cached under this name
    forced = validate(doc, node_access=NodeAccess(always_pull_images=True))
    policies = {c["name"]: c["imagePullPolicy"] for _, pod in pod_specs(render(forced.resolved))
                for c in [*pod.get("initContainers", []), *pod["containers"]]}
    assert policies and set(policies.values()) == {"Always"}, policies
    asked = {c["imagePullPolicy"] for _, pod in pod_specs(render(validate(doc).resolved))
             for c in [*pod.get("initContainers", []), *pod["containers"]]}
    assert "Never" in asked


def test_the_chart_passes_each_option_to_the_operator():
    def access(*settings: str) -> NodeAccess:
        return options_from(operator_args(*settings)).node_access

    assert access() == NodeAccess()
    assert access("nodeAccess.hostNetwork=true") == NodeAccess(host_network=True)
    assert access("nodeAccess.controlPlaneTolerations=true") == NodeAccess(control_plane_tolerations=True)
    assert access("nodeAccess.hostPathCreation=true") == NodeAccess(host_path_creation=True)
    assert access("alwaysPullImages=true") == NodeAccess(always_pull_images=True)
    refused = template("--set", "nodeAccess.hostNetwrk=true")
    assert refused.returncode != 0 and "hostNetwrk" in refused.stderr


class MemoryClient:
    """The API as the reconcile uses it, recording every write."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    def read_config_map_key(self, namespace: str, name: str, key: str) -> str | None:
        return None

    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        self.writes.append(("status", status))

    def post_event(self, owner: dict, type_: str, reason: str, message: str) -> None:
        self.writes.append(("event", reason))

    def __getattr__(self, name: str) -> Any:
        def write(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"{name}: a refused spec must leave the running children alone")
        return write


# What an older operator ran that this one refuses: (the decode fields, what allows them, the finding,
# the flag and the chart value its message names).
REFUSED_AFTER_UPGRADE = {
    "host-network": ({"hostNetwork": True}, NodeAccess(host_network=True), "HostNetworkNotAllowed",
                     "--allow-host-network", "nodeAccess.hostNetwork"),
    "tolerate-everything": ({"tolerations": [{"operator": "Exists"}]},
                            NodeAccess(control_plane_tolerations=True), "TolerationNotAllowed",
                            "--allow-control-plane-tolerations", "nodeAccess.controlPlaneTolerations"),
    "create-on-the-node": ({"hostMounts": {"generation": "A3", "paths": [
                               {"path": "/data/models", "type": "DirectoryOrCreate"}]}},
                           NodeAccess(host_path_creation=True), "HostPathCreationNotAllowed",
                           "--allow-host-path-creation", "nodeAccess.hostPathCreation"),
}


@pytest.mark.parametrize("refused", REFUSED_AFTER_UPGRADE)
def test_an_upgrade_keeps_a_running_deployment_the_new_rules_refuse_serving(refused):
    """Before these rules hostNetwork was a warning and the rest passed: such a PDDeployment runs. The
    new operator refuses its spec and names the option to set, but deletes and rewrites none of its
    children."""
    fields, allowing, code, flag, value = REFUSED_AFTER_UPGRADE[refused]
    doc = example()
    doc["spec"]["decode"] |= fields
    running = validate(doc, node_access=allowing)
    children = desired(running)
    body = copy.deepcopy(doc)
    body["metadata"] |= {"namespace": running.deployment.namespace, "uid": OWNER_UID, "generation": 2}
    body["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "Serving", "message": "",
                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    client = MemoryClient()
    with pytest.raises(reconcile_mod.InvalidSpec, match=flag):
        reconcile_mod.reconcile(client, ProxyStateReader(), body, children, [])  # type: ignore[arg-type]
    (status,) = [s for verb, s in client.writes if verb == "status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", code)
    assert flag in ready["message"] and value in ready["message"]
    assert {verb for verb, _ in client.writes} <= {"status", "event"}

"""Host paths a PDDeployment may mount: refused with a finding at the field path by every door that
validates (pdctl, the admission verdict, the validator the controller calls), by the admin's
allow-list (the chart's hostPaths -> `pd-operator run --allow-host-path`) and, whatever that list
says, for `/`, unnormalised paths and the node's credential and runtime directories."""

from __future__ import annotations

import copy
import posixpath

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pd_operator import cli
from pd_operator.controller.admission import verdict
from pd_operator.controller.main import options_from
from pd_operator.render import render
from pd_operator.render.runnable import validate
from pd_operator.spec.host_paths import DEFAULT, GENERATION_MOUNTS, PROTECTED, WEIGHTS_ROOT, HostPathPolicy
from support.helm_chart import operator_args, operator_container, rendered, template
from support.renders import EXAMPLES, VALID_EXAMPLES
from support.specs import example

HOST_PATH_EXAMPLE = EXAMPLES / "deepseek-v3.2-multinode-decode.yaml"  # weights.hostPath /data/models
CODES = {"HostPathProtected", "HostPathNotNormalised", "HostPathNotAllowed"}


def with_weights(path: str) -> dict:
    doc = example(HOST_PATH_EXAMPLE)
    doc["spec"]["model"]["weights"]["hostPath"]["path"] = path
    return doc


def with_mounts(role: str, *paths: str, generation: str = "A3") -> dict:
    doc = example(HOST_PATH_EXAMPLE)
    doc["spec"][role]["hostMounts"] = {"generation": generation,
                                     "paths": [{"path": p, "type": "Directory"} for p in paths]}
    return doc


def host_path_errors(doc: dict, policy: HostPathPolicy = DEFAULT) -> dict[str, str]:
    return {f.path: f.code for f in validate(doc, host_path_policy=policy).errors if f.code in CODES}


def test_the_examples_mount_only_allowed_paths():
    for path in VALID_EXAMPLES:
        assert validate(example(path)).ok, path.name
        assert host_path_errors(example(path)) == {}


def test_weights_at_the_root_are_refused_at_admission_naming_the_field():
    v = verdict(with_weights("/"), "CREATE")
    assert not v.allowed
    assert v.message.startswith("spec.model.weights.hostPath.path: / is the node's whole file system")
    assert host_path_errors(with_weights("/")) == {"spec.model.weights.hostPath.path": "HostPathProtected"}


@pytest.mark.parametrize("path", ["/var/lib/kubelet", "/var/lib/kubelet/pods", "/etc/kubernetes/pki",
                                  "/var/run", "/run/containerd", "/proc", "/root/.cache", "/etc", "/var",
                                  "/var/lib", "/etc/ssh/ssh_host_rsa_key", "/sys/fs"])
def test_node_credentials_and_runtimes_and_their_parents_are_refused(path):
    v = verdict(with_mounts("decode", "/usr/local/Ascend/driver/lib64", path), "CREATE")
    assert not v.allowed and v.message.startswith("spec.decode.hostMounts.paths[1].path: ")
    assert host_path_errors(with_mounts("decode", path)) == {
        "spec.decode.hostMounts.paths[0].path": "HostPathProtected"}
    # No allow-list can let them in: the policy itself refuses to name them.
    with pytest.raises(ValueError, match="can never be allowed"):
        HostPathPolicy.of([path])


@pytest.mark.parametrize("path", ["//", "/data//models", "/data/../etc/kubernetes", "/data/./models",
                                  "/data/", "/data/models ", "/data/models\n", "/data/\x00x"])
def test_unnormalised_paths_are_refused(path):
    assert host_path_errors(with_weights(path)) == {
        "spec.model.weights.hostPath.path": "HostPathNotNormalised"}
    assert host_path_errors(with_mounts("prefill", path)) == {
        "spec.prefill.hostMounts.paths[0].path": "HostPathNotNormalised"}


def test_a_path_outside_the_allow_list_is_refused_until_the_admin_allows_it():
    doc = with_mounts("prefill", "/mnt/sfs_turbo/models")
    assert host_path_errors(doc) == {"spec.prefill.hostMounts.paths[0].path": "HostPathNotAllowed"}
    admin = HostPathPolicy.of([*DEFAULT.allowed, "/mnt/sfs_turbo"])
    assert host_path_errors(doc, admin) == {}
    # Under an entry, by whole path components: /mnt/sfs_turbo2 is another directory.
    assert host_path_errors(with_mounts("prefill", "/mnt/sfs_turbo2"), admin) == {
        "spec.prefill.hostMounts.paths[0].path": "HostPathNotAllowed"}


def test_a_narrower_list_refuses_the_generation_mounts_it_leaves_out():
    narrow = HostPathPolicy.of([WEIGHTS_ROOT, "/usr/local/Ascend/driver", "/usr/local/dcmi",
                                "/etc/ascend_install.info", "/usr/local/bin/npu-smi"])
    assert host_path_errors(example(HOST_PATH_EXAMPLE), narrow) == {}  # A3 on both roles
    a2 = with_mounts("decode", generation="A2")
    assert host_path_errors(a2, narrow) == {"spec.decode.hostMounts.generation": "HostPathNotAllowed"}
    message = next(f.message for f in validate(a2, host_path_policy=narrow).errors)
    assert message.startswith("/usr/local/sbin/npu-smi is outside the host paths the cluster admin allows")


def test_the_default_allows_every_generation_preset_and_the_weights_root():
    for generation, mounts in GENERATION_MOUNTS.items():
        for path, _ in mounts:
            assert DEFAULT.allows(path, "default"), (generation, path)
    assert DEFAULT.allows(WEIGHTS_ROOT + "/models", "default")
    assert not DEFAULT.allows("/opt/models", "default")


def test_the_controller_renders_no_refused_path():
    doc = with_mounts("decode", "/var/lib/kubelet")
    validation = validate(doc)
    assert validation.resolved is None  # the controller renders nothing and reports the findings
    ok = validate(with_mounts("decode", "/data/extra"))
    volumes = [v for m in render(ok.resolved) if m["kind"] == "StatefulSet"
               for v in m["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    assert {v["hostPath"]["path"] for v in volumes} >= {"/data/extra", "/data/models"}
    assert all(DEFAULT.allows(v["hostPath"]["path"], "default") for v in volumes)


def test_pdctl_validate_takes_the_operators_allow_list(tmp_path, capsys):
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(with_mounts("decode", "/mnt/weights")))
    assert cli.main(["validate", str(path)]) == cli.EXIT_FINDINGS
    assert "HostPathNotAllowed at spec.decode.hostMounts.paths[0].path" in capsys.readouterr().out
    assert cli.main(["validate", str(path), *[f"--allow-host-path={p}" for p in DEFAULT.allowed],
                     "--allow-host-path=/mnt/weights"]) == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main(["validate", str(path), "--allow-host-path=/var/lib"]) == cli.EXIT_UNREADABLE
    err = capsys.readouterr().err
    assert err.startswith("pdctl: --allow-host-path: ") and "/var/lib contains /var/lib/kubelet" in err


def test_the_operator_refuses_to_start_with_a_protected_entry(capsys):
    with pytest.raises(SystemExit) as exit_info:
        options_from(["run", "--no-webhook", "--allow-host-path=/etc"])
    assert exit_info.value.code == 2
    assert "--allow-host-path: " in capsys.readouterr().err
    assert options_from(["run", "--no-webhook"]).host_path_policy == DEFAULT


def test_the_chart_passes_its_list_to_the_operator():
    def policy(*settings: str) -> HostPathPolicy:
        return options_from(operator_args(*settings)).host_path_policy

    assert options_from(operator_container(rendered("default"))["args"]).host_path_policy == DEFAULT
    added = policy("hostPaths.additional[0]=/mnt/sfs_turbo")
    assert added.allowed == (*DEFAULT.allowed, "/mnt/sfs_turbo")
    assert policy("hostPaths.allowed[0]=/data/models").allowed == ("/data/models",)
    refused = template("--set", "hostPaths.additional[0]=/var/lib/kubelet/")
    assert refused.returncode != 0 and "hostPaths/additional/0" in refused.stderr


# Paths built from the protected directories, the allowed roots and tricky components.
COMPONENT = st.sampled_from(["", ".", "..", "data", "models", "var", "lib", "kubelet", "etc", "kubernetes",
                             "run", "usr", "local", "Ascend", "driver", "root", "proc", " ", "x\n"])
PATHS = st.one_of(
    st.lists(COMPONENT, min_size=0, max_size=6).map(lambda parts: "/" + "/".join(parts)),
    st.sampled_from([*PROTECTED, *DEFAULT.allowed]).flatmap(
        lambda root: st.lists(COMPONENT, max_size=3).map(lambda parts: "/".join([root, *parts]))))


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(PATHS)
def test_whatever_the_path_an_admitted_one_is_plain_allowed_and_clear_of_protected_ones(path):
    doc = with_mounts("decode", path)
    if validate(doc).ok:
        assert posixpath.normpath(path) == path and not path.startswith("//") and path.strip() == path
        assert DEFAULT.allows(path, "default")
        for protected in PROTECTED:
            assert not (path + "/").startswith(protected + "/"), (path, protected)
            assert not (protected + "/").startswith(path + "/"), (path, protected)


def test_refused_documents_render_nothing_and_raise_nothing():
    for path in ("/", "//", "/var/lib/kubelet", "/etc/kubernetes/pki", "/a/../b", "/opt"):
        doc = copy.deepcopy(with_mounts("prefill", path))
        assert validate(doc).resolved is None

"""The rendered operator Deployment: hardened pod, probes, resources and the exact command line
each mode passes to `pd-operator run` (the contract with pd_operator.controller.main)."""

from __future__ import annotations

import tomllib

import pytest
import yaml

from pd_operator.controller.main import options_from
from pd_operator.serving_image.contents import DEFAULT_TOOLS_IMAGE
from pd_operator.spec.host_paths import DEFAULT as DEFAULT_HOST_PATHS
from support.helm_chart import RELEASE, REPO, operator_container, operator_deployment, rendered, template

FULLNAME = f"{RELEASE}-pd-operator"
SCRAPER = ('{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}},'
           '"podSelector":{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}}')
COMMON = ["--health-port=8080", "--metrics-port=9090", f"--metrics-scraper={SCRAPER}"]
SELF_SIGNED = ["--webhook-port=9443", "--webhook-self-signed", f"--webhook-config-name={FULLNAME}"]
CERT_DIR = ["--webhook-port=9443", "--webhook-cert-dir=/etc/pd-operator/webhook-tls"]
HOST_PATHS = [f"--allow-host-path={p}" for p in DEFAULT_HOST_PATHS.allowed]
TOOLS = [f"--tools-image={DEFAULT_TOOLS_IMAGE}"]  # the chart's own image (every value set keeps it)

EXPECTED_ARGS = {
    "default": ["run", "--all-namespaces", *COMMON, *SELF_SIGNED, "--log-format=json", *TOOLS, *HOST_PATHS],
    "namespaced": [
        "run", "--namespace=llm-prod", "--namespace=llm-staging", *COMMON, *SELF_SIGNED, "--log-format=json",
        *TOOLS, *HOST_PATHS,
    ],
    "cert-manager": ["run", "--all-namespaces", *COMMON, *CERT_DIR, "--log-format=json", *TOOLS, *HOST_PATHS],
    "webhook-off": ["run", "--all-namespaces", *COMMON, "--no-webhook", "--log-format=plain", *TOOLS,
                    *HOST_PATHS],
    "metrics": ["run", "--all-namespaces", *COMMON, *SELF_SIGNED, "--log-format=json", *TOOLS, *HOST_PATHS],
    "peering": [
        "run", "--all-namespaces", *COMMON, *CERT_DIR, "--peering=pd-operator-peers", "--log-format=json",
        *TOOLS, *HOST_PATHS,
    ],
    "peering-namespaced": [
        "run", "--namespace=llm-prod", *COMMON, "--no-webhook", f"--peering={FULLNAME}", "--log-format=json",
        *TOOLS, *HOST_PATHS,
    ],
}


def test_every_value_set_has_expected_args(value_set):
    assert value_set in EXPECTED_ARGS, f"add the expected `pd-operator run` flags for {value_set}"


@pytest.mark.parametrize("value_set", sorted(EXPECTED_ARGS))
def test_operator_command_line(value_set):
    container = operator_container(rendered(value_set))
    assert container["command"] == ["pd-operator"]
    assert container["args"] == EXPECTED_ARGS[value_set]


def test_the_tools_image_is_the_operators_own(value_set):
    """The serving pods' init container and the proxy run the image the operator runs from."""
    container = operator_container(rendered(value_set))
    assert f"--tools-image={container['image']}" in container["args"]


def test_the_default_tools_image_is_the_charts_default_image():
    values = yaml.safe_load((REPO / "charts/pd-operator/values.yaml").read_text())
    chart = yaml.safe_load((REPO / "charts/pd-operator/Chart.yaml").read_text())
    tag = values["image"]["tag"] or chart["appVersion"]
    assert f"{values['image']['repository']}:{tag}" == DEFAULT_TOOLS_IMAGE


def test_command_is_the_packages_console_script():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pd-operator"].startswith("pd_operator.controller.main:")


def test_pod_runs_hardened(value_set):
    docs = rendered(value_set)
    pod = operator_deployment(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod.get("hostNetwork", False) is False and pod.get("hostPID", False) is False
    assert pod.get("automountServiceAccountToken", True) is True  # it talks to the API server
    container = operator_container(docs)
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security.get("privileged", False) is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root still needs a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_resources_requested_and_limited(value_set):
    resources = operator_container(rendered(value_set))["resources"]
    for kind in ("requests", "limits"):
        assert set(resources[kind]) >= {"cpu", "memory"}, kind


def test_probes_hit_healthz_on_the_health_port(value_set):
    container = operator_container(rendered(value_set))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == 8080 and "--health-port=8080" in container["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe


def test_container_ports_match_flags(value_set):
    container = operator_container(rendered(value_set))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--metrics-port={ports['metrics']}" in container["args"]
    if "--no-webhook" in container["args"]:
        assert "webhook" not in ports
    else:
        assert f"--webhook-port={ports['webhook']}" in container["args"]


def test_replicas_and_rollout_strategy():
    single = operator_deployment(rendered("default"))["spec"]
    assert single["replicas"] == 1
    # No peering with one replica: a rolling update would briefly run two operators.
    assert single["strategy"] == {"type": "Recreate"}
    several = operator_deployment(rendered("peering"))["spec"]
    assert several["replicas"] == 2 and "strategy" not in several


def test_kopf_identity_comes_from_the_pod_name(value_set):
    env = {e["name"]: e for e in operator_container(rendered(value_set))["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_extra_pod_labels_cannot_break_the_selector():
    result = template("--set", "podLabels.team=llm", "--set", "podLabels.app\\.kubernetes\\.io/name=other")
    assert result.returncode == 0, result.stderr
    deployment = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "llm"
    for key, value in deployment["spec"]["selector"]["matchLabels"].items():
        assert labels[key] == value


@pytest.mark.parametrize("value_set", sorted(EXPECTED_ARGS))
def test_the_operator_accepts_the_rendered_command_line(value_set, tmp_path):
    # The real parser of `pd-operator run`: every flag the chart passes must mean what the chart means.
    (tmp_path / "tls.crt").write_text("cert")  # the cert-manager Secret, as mounted
    (tmp_path / "tls.key").write_text("key")
    cert_dir = "--webhook-cert-dir=/etc/pd-operator/webhook-tls"
    args = [f"--webhook-cert-dir={tmp_path}" if a == cert_dir else a for a in EXPECTED_ARGS[value_set]]
    options = options_from(args)

    values = {"namespaced": ["llm-prod", "llm-staging"], "peering-namespaced": ["llm-prod"]}
    assert options.namespaces == values.get(value_set, [])
    assert (options.health_port, options.metrics_port) == (8080, 9090)
    assert options.webhook == ("--no-webhook" not in args)
    assert options.webhook_self_signed == ("--webhook-self-signed" in args)
    assert options.webhook_config_name == (FULLNAME if options.webhook_self_signed else None)
    assert options.webhook_cert_dir == (str(tmp_path) if cert_dir in EXPECTED_ARGS[value_set] else None)
    assert options.peering == {"peering": "pd-operator-peers", "peering-namespaced": FULLNAME}.get(value_set)
    assert options.log_format == ("plain" if value_set == "webhook-off" else "json")
    assert options.host_path_policy == DEFAULT_HOST_PATHS

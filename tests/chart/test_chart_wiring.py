"""The rendered objects refer to each other correctly: Services reach the operator's named ports,
the webhook reaches its Service, certificates reach the pod, monitors reach the metrics Service,
bindings reach the ServiceAccount, peering objects carry the name the operator is given."""

from __future__ import annotations

import yaml

from pd_operator.controller.main import ADMIN_KEY_ENV
from pd_operator.render import render
from support.helm_chart import (
    NAMESPACE,
    find,
    one,
    operator_container,
    operator_deployment,
    rendered,
    template,
)
from support.specs import example, resolve

WEBHOOK_PATH = "/validate-pddeployment"


def _flags(docs: list[dict], name: str) -> list[str]:
    """The values of every `--name=value` the operator is started with."""
    prefix = f"--{name}="
    return [a[len(prefix):] for a in operator_container(docs)["args"] if a.startswith(prefix)]


def _flag(docs: list[dict], name: str) -> str | None:
    values = _flags(docs, name)
    assert len(values) <= 1, values
    return values[0] if values else None


def _pod_labels(docs: list[dict]) -> dict:
    return operator_deployment(docs)["spec"]["template"]["metadata"]["labels"]


def test_services_select_the_operator_pods_on_named_ports(value_set):
    docs = rendered(value_set)
    pod_labels = _pod_labels(docs)
    port_names = {p["name"] for p in operator_container(docs)["ports"]}
    services = find(docs, "Service")
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items(), service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, port


def _webhook_services(docs: list[dict]) -> list[dict]:
    return [s for s in find(docs, "Service") if s["metadata"]["name"].endswith("-webhook")]


def test_webhook_configuration_reaches_the_webhook_service(value_set):
    docs = rendered(value_set)
    configs = find(docs, "ValidatingWebhookConfiguration")
    if _flag(docs, "webhook-port") is None:
        assert configs == [] and _webhook_services(docs) == []
        return
    (config,) = configs
    if "--webhook-self-signed" in operator_container(docs)["args"]:
        # The operator fills this in (and is called at the pod IP): the chart adds no webhook of its own.
        assert _flag(docs, "webhook-config-name") == config["metadata"]["name"]
        assert config["webhooks"] == [] and _webhook_services(docs) == []
        env = {e["name"]: e for e in operator_container(docs)["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        return
    (hook,) = config["webhooks"]
    ref = hook["clientConfig"]["service"]
    service = one(docs, "Service", ref["name"], ref["namespace"])
    assert ref["path"] == WEBHOOK_PATH
    assert ref["port"] in {p["port"] for p in service["spec"]["ports"]}
    (rule,) = hook["rules"]
    assert rule["apiGroups"] == ["pd.serving.dev"] and rule["apiVersions"] == ["v1alpha1"]
    assert rule["resources"] == ["pddeployments"] and set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert _flag(docs, "webhook-config-name") is None  # the operator leaves this configuration alone


def _cert_manager_webhook(*settings: str) -> dict:
    result = template("--set", "webhook.certManager.enabled=true", *settings)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    (config,) = find(docs, "ValidatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    return hook


def test_webhook_is_limited_to_the_watched_namespaces():
    hook = _cert_manager_webhook("--set", "watchNamespaces={llm-prod,llm-staging}")
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert expression == {
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": ["llm-prod", "llm-staging"],
    }
    assert "namespaceSelector" not in _cert_manager_webhook()


def test_failure_policy_and_timeout_follow_the_values():
    assert _cert_manager_webhook()["failurePolicy"] == "Fail"
    hook = _cert_manager_webhook("--set", "webhook.failurePolicy=Ignore", "--set", "webhook.timeoutSeconds=5")
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 5


def test_self_signed_webhook_refuses_a_failure_policy_it_cannot_apply():
    result = template("--set", "webhook.failurePolicy=Ignore")
    assert result.returncode != 0
    assert "webhook.failurePolicy: the operator's self-signed webhook always fails closed" in result.stderr


def test_cert_manager_certificate_reaches_the_pod_and_the_ca_bundle():
    docs = rendered("cert-manager")
    certificate = one(docs, "Certificate")
    (config,) = find(docs, "ValidatingWebhookConfiguration")
    name, namespace = certificate["metadata"]["name"], certificate["metadata"]["namespace"]
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{namespace}/{name}"
    service = config["webhooks"][0]["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    issuer = one(docs, "Issuer", certificate["spec"]["issuerRef"]["name"], namespace)
    assert "selfSigned" in issuer["spec"]
    pod = operator_deployment(docs)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if "secret" in v)
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    mount = next(m for m in operator_container(docs)["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] is True and _flag(docs, "webhook-cert-dir") == mount["mountPath"]


def test_an_existing_issuer_is_used_instead_of_a_chart_made_one():
    docs = rendered("peering")
    assert find(docs, "Issuer") == []
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {"name": "cluster-ca", "kind": "ClusterIssuer"}


def test_self_signed_mode_has_no_cert_manager_objects():
    docs = rendered("default")
    assert find(docs, "Certificate") == [] and find(docs, "Issuer") == []
    (config,) = find(docs, "ValidatingWebhookConfiguration")
    assert "annotations" not in config["metadata"]
    assert not [v for v in operator_deployment(docs)["spec"]["template"]["spec"]["volumes"] if "secret" in v]


def test_service_monitor_scrapes_the_metrics_service():
    docs = rendered("metrics")
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service", monitor["metadata"]["name"], NAMESPACE)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # The selector must not also match the webhook Service.
    webhook = [s for s in find(docs, "Service") if s is not service]
    for other in webhook:
        assert not monitor["spec"]["selector"]["matchLabels"].items() <= other["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert find(rendered("default"), "ServiceMonitor") == []


def test_bindings_grant_roles_to_the_operator_service_account(value_set):
    docs = rendered(value_set)
    account = operator_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    one(docs, "ServiceAccount", account, NAMESPACE)
    bindings = find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding")
    assert bindings
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
        ref = binding["roleRef"]
        one(docs, ref["kind"], ref["name"], binding["metadata"].get("namespace"))


def test_peering_objects_exist_under_the_name_the_operator_gets(value_set):
    docs = rendered(value_set)
    name = _flag(docs, "peering")
    cluster, namespaced = find(docs, "ClusterKopfPeering"), find(docs, "KopfPeering")
    if name is None:
        assert cluster == [] and namespaced == []
    elif "--all-namespaces" in operator_container(docs)["args"]:
        assert [p["metadata"]["name"] for p in cluster] == [name] and namespaced == []
    else:
        served = sorted(_flags(docs, "namespace"))
        assert sorted(p["metadata"]["namespace"] for p in namespaced) == served
        assert {p["metadata"]["name"] for p in namespaced} == {name} and cluster == []



def test_the_proxy_pod_monitor_scrapes_every_rendered_proxys_metrics_port():
    monitor = one(rendered("metrics"), "PodMonitor")
    proxy = next(m for m in render(resolve(example())) if m["kind"] == "Deployment")
    labels = proxy["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for c in proxy["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert find(rendered("default"), "PodMonitor") == []


def test_the_proxy_admin_key_reaches_the_operator_from_the_charts_secret(value_set):
    docs = rendered(value_set)
    env = operator_container(docs)["env"]
    (ref,) = [e["valueFrom"]["secretKeyRef"] for e in env if e["name"] == ADMIN_KEY_ENV]
    secret = one(docs, "Secret", ref["name"], NAMESPACE)
    assert len(secret["data"][ref["key"]]) >= 48

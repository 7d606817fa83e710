"""`pd-operator run` flags: the set the Helm chart renders parses, and bad ones end in one line."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from pd_operator.controller.main import options_from


def test_chart_flags_cluster_wide_self_signed():
    o = options_from(["run", "--all-namespaces", "--health-port=8080", "--metrics-port=9090",
                      "--webhook-port=9443", "--webhook-self-signed", "--webhook-config-name=pdo",
                      "--peering=pdo", "--log-format=json"])
    got = (o.namespaces, o.webhook, o.webhook_self_signed, o.webhook_config_name, o.peering, o.log_format)
    assert got == ([], True, True, "pdo", "pdo", "json")


def test_chart_flags_namespaced_with_cert_dir(tmp_path):
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text("x")
    o = options_from(["run", "--namespace=a", "--namespace=b", f"--webhook-cert-dir={tmp_path}"])
    assert o.namespaces == ["a", "b"] and o.webhook_cert_dir == str(tmp_path) and o.peering is None


@pytest.mark.parametrize(("argv", "says"), [
    (["run"], "--no-webhook"),
    (["run", "--no-webhook", "--webhook-config-name=x"], "needs --webhook-self-signed"),
    (["run", "--webhook-cert-dir=/nonexistent"], "has no tls.crt"),
    (["run", "--no-webhook", "--metrics-port=70000"], "not a TCP port"),
    (["run", "--no-webhook", "-A", "--namespace=x"], "not allowed with"),
    (["run", "--no-webhook", "--drift-interval=0"], "must be positive"),
    (["run", "--no-webhook", "--metrics-scraper={not json"], "--metrics-scraper {not json"),
    (["run", "--no-webhook", '--metrics-scraper={"podSelector": {}, "ipBlock": {"cidr": "10.0.0.0/8"}}'],
     "either ipBlock or selectors"),
    (["run", "--no-webhook", '--metrics-scraper={"pod": {}}'], "pod: Extra inputs are not permitted"),
])
def test_bad_flags_exit_2_with_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        options_from(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and "Traceback" not in err


def test_metrics_scrapers_become_the_boundary(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    peer = '{"namespaceSelector": {"matchLabels": {"team": "obs"}}}'
    boundary = options_from(["run", "--no-webhook", f"--metrics-scraper={peer}"]).boundary
    assert boundary.operator_namespace == "ops"
    wanted = {"namespaceSelector": {"matchLabels": {"team": "obs"}}}
    assert [p.to_wire() for p in boundary.scrapers] == [wanted]
    assert options_from(["run", "--no-webhook"]).boundary.scrapers == ()


def test_peers_get_distinct_priorities_so_one_of_them_works():
    # Equal priorities make kopf pause every peer; each process draws its own.
    from pd_operator.controller.main import settings_for

    options = options_from(["run", "--no-webhook", "--peering=pd-operator"])
    priorities = {settings_for(options).peering.priority for _ in range(5)}
    assert len(priorities) == 5 and min(priorities) > 0
    standalone = settings_for(options_from(["run", "--no-webhook"]))
    assert standalone.peering.priority == 0


def test_kopf_keeps_no_diff_base_and_nothing_needs_one():
    """settings_for gives kopf an empty diff base (handlers.NoDiffBase), which is right only while
    every handler is an event handler: a changing one (on.create/update/resume/field) reads the
    diff base, so adding one must replace NoDiffBase."""
    import kopf

    from pd_operator.controller import handlers
    from pd_operator.controller.main import settings_for
    from pd_operator.controller.metrics import Metrics
    from pd_operator.controller.runner import Runner

    settings = settings_for(options_from(["run", "--no-webhook"]))
    assert isinstance(settings.persistence.diffbase_storage, handlers.NoDiffBase)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, Runner(client=None, metrics=Metrics()), webhook=None)  # type: ignore[arg-type]
    assert registry._watching.get_all_handlers() and registry._indexing.get_all_handlers()
    assert not registry._changing.get_all_handlers()
    assert settings.persistence.diffbase_storage.fetch(body=kopf.Body({"spec": {}})) is None


def test_an_index_entry_is_a_copy_of_its_own_without_managed_fields():
    """The index keeps each watched object by its owner's key: a deep copy (kopf reuses the event's
    body), without managedFields, which nothing reads; the event's body keeps them."""
    from pd_operator.api.labels import DEPLOYMENT
    from pd_operator.controller.handlers import by_owner

    body = {"kind": "StatefulSet", "metadata": {"name": "a", "labels": {DEPLOYMENT: "glm"},
                                                "managedFields": [{"manager": "pd-operator"}]},
            "spec": {"replicas": 2, "template": {"metadata": {"labels": {"x": "y"}}}}}
    assert inspect.iscoroutinefunction(by_owner)  # kopf calls it in its loop, not in a thread
    entries = asyncio.run(by_owner(namespace="ns", labels=body["metadata"]["labels"], body=body))
    ((owner, entry),) = entries.items()
    assert owner == ("ns", "glm")
    assert "managedFields" not in entry["metadata"] and body["metadata"]["managedFields"]
    assert entry["spec"] == body["spec"] and entry["metadata"]["labels"] == body["metadata"]["labels"]
    entry["spec"]["template"]["metadata"]["labels"]["x"] = "z"
    entry["metadata"]["labels"][DEPLOYMENT] = "other"
    assert body["spec"]["template"]["metadata"]["labels"] == {"x": "y"}
    assert body["metadata"]["labels"] == {DEPLOYMENT: "glm"}

"""Valid, boundary and malformed PDDeployments through the three doors user input comes in by:
`pdctl validate` (cli.main in-process), the admission webhook (kube-apiserver calling the real
operator's webhook, installed by the chart, for server-side dry-run creates and updates) and
`validate()` + `render()` as the controller's reconcile calls them. None may raise, every
rejection must name a field path, and what the API server lets through to the webhook gets the
validator's verdict. Each test prints how many inputs it tried and rejected and the slowest call
(figures only: see them with -s or -rA)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from pd_operator import cli
from pd_operator.api.types import GROUP, PLURAL, VERSION
from pd_operator.controller.reconcile import manifest_of
from pd_operator.controller.webhook import WEBHOOK_ID, WEBHOOK_NAME
from pd_operator.render import render
from pd_operator.render.runnable import validate
from support.cluster import ApiError, ControlPlane, namespace_name
from support.fleet import FLEET_EXAMPLE
from support.installed import OperatorProcess, helm_install, helm_uninstall
from support.spec_strategies import MB, documents
from support.specs import example

pytestmark = pytest.mark.faults

EXAMPLES = 200
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
ERROR_LINE = re.compile(r"^  error: \w+ at (?P<path>.+?): ")


@dataclass
class Tally:
    door: str
    tried: int = 0
    rejected: int = 0
    rejected_with_path: int = 0
    slowest_s: float = 0.0
    notes: dict[str, int] = field(default_factory=dict)

    def timed(self, seconds: float, *, new_input: bool = True) -> None:
        self.tried += new_input
        self.slowest_s = max(self.slowest_s, seconds)

    def note(self, what: str) -> None:
        self.notes[what] = self.notes.get(what, 0) + 1

    def reject(self, with_path: bool) -> None:
        self.rejected += 1
        self.rejected_with_path += with_path

    def summary(self) -> str:
        extra = "".join(f", {k}: {v}" for k, v in self.notes.items())
        return (f"{self.door}: tried {self.tried}, rejected {self.rejected}, rejected with a field path "
                f"{self.rejected_with_path}, slowest {self.slowest_s * 1000:.0f} ms{extra}")

    def check(self) -> None:
        print(self.summary())
        assert self.tried >= EXAMPLES * 0.8, self.summary()
        assert 0 < self.rejected < self.tried, self.summary()  # both kinds of input were seen
        assert self.rejected_with_path == self.rejected, self.summary()


def test_pdctl_validate(tmp_path):
    tally = Tally("pdctl validate")
    manifest = tmp_path / "pdd.yaml"

    @SETTINGS
    @given(documents)
    def one(doc):
        manifest.write_text(yaml.dump(doc, Dumper=yaml.CSafeDumper))
        out, err = io.StringIO(), io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["validate", str(manifest)])
        tally.timed(time.perf_counter() - started)
        text = out.getvalue() + err.getvalue()
        assert "Traceback" not in text and code in (0, 1, 2), text[-2000:]
        if code == 2:  # the file holds no document (a bare null): the message names the file
            tally.note("no document")
            tally.reject(err.getvalue().startswith(f"pdctl: {manifest}: "))
        elif code == 1:
            lines = [line for line in out.getvalue().splitlines() if line.startswith("  error: ")]
            tally.reject(bool(lines) and all(ERROR_LINE.match(line) for line in lines))

    one()
    tally.check()


def test_validate_and_render_as_the_controller_calls_them():
    tally = Tally("controller validate+render")
    configs = {"glm-config": {"config.json": "{}"}}

    def read_config_map(name: str, key: str) -> str | None:
        return configs.get(name, {}).get(key)

    @SETTINGS
    @given(documents)
    def one(doc):
        # What the API server stores: a mapping with metadata it filled in; the rest as sent.
        body = doc if isinstance(doc, dict) else {"apiVersion": "pd.serving.dev/v1alpha1",
                                                   "kind": "PDDeployment", "spec": doc}
        body = {**body, "metadata": {"name": "bad-input", "namespace": "default", "uid": "u-1",
                                     "generation": 3,
                                     **(body["metadata"] if isinstance(body.get("metadata"), dict) else {})}}
        body.setdefault("apiVersion", None)
        body.setdefault("kind", None)
        started = time.perf_counter()
        result = validate(manifest_of(body), read_config_map=read_config_map)
        if result.resolved is not None:
            render(result.resolved)
        tally.timed(time.perf_counter() - started)
        if not result.ok:
            tally.reject(bool(result.errors) and all(f.path for f in result.errors))

    one()
    tally.check()


WEBHOOK_DENIED = f'admission webhook "{WEBHOOK_NAME}" denied the request'


@dataclass
class Webhook:
    """The chart's operator with its webhook configured, a namespace, and a stored PDDeployment
    the updates replace."""

    op: OperatorProcess
    namespace: str
    base: dict

    @property
    def url(self) -> str:
        port = next(a.split("=", 1)[1] for a in self.op.argv if a.startswith("--webhook-port="))
        return f"https://127.0.0.1:{port}/{WEBHOOK_ID}"


@pytest.fixture(scope="module")
def webhook(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    cp, workdir = control_plane, tmp_path_factory.mktemp("webhook")
    namespace = namespace_name("bad-input")
    cp.create_namespace(namespace)
    release = helm_install(cp, workdir)
    try:
        with release.operator(cp, workdir) as op:
            op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "the webhook configured")
            base = example(FLEET_EXAMPLE, namespace)
            base["metadata"]["name"] = "bad-input-base"
            stored = cp.api("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}", base)
            yield Webhook(op, namespace, stored)
    finally:
        # Always: the self-signed configuration fails closed, and a leftover one would refuse every
        # later PDDeployment write in this session's cluster.
        helm_uninstall(cp, release)
        cp.delete_namespace(namespace)


def api_server_object(doc: Any, namespace: str) -> dict | None:
    """The document as a client would send it to the API server, or None when no client could (not
    a mapping, or metadata that is not a mapping)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata", {}), dict):
        return None
    meta = {"name": "bad-input", **doc.get("metadata", {}), "namespace": namespace}
    return {**doc, "metadata": meta}


def without_nulls(value: Any) -> Any:
    """What the API server keeps of a document: it drops null fields of a CRD whose schema does not
    make them nullable (ours makes none) before validating and calling webhooks
    (k8s.io/apiextensions-apiserver: pkg/apiserver/schema/defaulting/prunenulls.go @ v0.36.3)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def dry_run(cp: ControlPlane, method: str, path: str, obj: dict) -> tuple[int, str]:
    """A server-side dry run as `kubectl apply --dry-run=server` sends it (strict field validation,
    kubectl's default: unknown fields are refused, not dropped): (HTTP status, message)."""
    try:
        cp.api(method, f"{path}?dryRun=All&fieldValidation=Strict", obj)
        return 200, ""
    except ApiError as err:
        try:
            return err.status, str(json.loads(err.body).get("message", err.body))
        except ValueError:
            return err.status, err.body


def test_admission_webhook_through_the_api_server(control_plane, webhook):
    """Each document is created and, as a replacement of a stored PDDeployment, updated with a
    server-side dry run: the API server checks it against the CRD's schema and calls our webhook,
    which must allow exactly what the validator accepts and name every error's field path."""
    cp = control_plane
    tally = Tally("admission webhook via kube-apiserver")
    collection = f"/apis/{GROUP}/{VERSION}/namespaces/{webhook.namespace}/{PLURAL}"
    base = f"{collection}/{webhook.base['metadata']['name']}"

    def update(obj: dict) -> tuple[int, str]:
        # The operator writes the stored object's status meanwhile: replace the version just read.
        for _ in range(10):
            version = cp.api("GET", base)["metadata"]["resourceVersion"]
            status, message = dry_run(cp, "PUT", base, {**obj, "metadata": {**obj["metadata"],
                                                                             "resourceVersion": version}})
            if status != 409:
                return status, message
        raise AssertionError(f"{base} kept changing")

    @SETTINGS
    @given(documents)
    def one(doc):
        obj = api_server_object(doc, webhook.namespace)
        if obj is None:
            tally.note("not an API object")
            return
        # The update replaces the stored object: the document under the stored one's name.
        replacement = {**obj, "metadata": {**obj["metadata"], "name": webhook.base["metadata"]["name"]}}
        named, rejected = [], False
        for operation, body, send in (("CREATE", obj, lambda: dry_run(cp, "POST", collection, obj)),
                                      ("UPDATE", replacement, lambda: update(replacement))):
            sent, result = validate(body), validate(without_nulls(body))  # the latter: what the webhook sees
            paths = [f.path for f in result.errors]
            rejected |= not sent.ok
            started = time.perf_counter()
            status, message = send()
            tally.timed(time.perf_counter() - started, new_input=operation == "CREATE")
            assert "Traceback" not in message, message
            if status == 200:
                assert result.ok, f"{operation} admitted; the validator says {paths}"
            elif WEBHOOK_DENIED in message:
                assert not result.ok, f"{operation} denied, the validator accepts it: {message[:500]}"
                named.append(bool(paths) and all(p in message for p in paths))
                tally.note(f"{operation} denied by the webhook")
            else:  # refused by the API server itself (schema, unknown field, name): pdctl refuses it too
                assert not sent.ok, f"{operation}: HTTP {status} {message[:500]}"
                tally.note(f"{operation} refused before the webhook")
        if named:  # the webhook saw it (else the API server's own checks refused it: noted above)
            tally.reject(all(named))
        elif rejected:
            tally.note("refused by the API server alone")

    one()
    tally.check()


def admission_review(url: str, obj: dict, operation: str) -> tuple[int, dict | None]:
    """POST an AdmissionReview as the API server does; (HTTP status, response or None)."""
    request = {"uid": "r-1", "operation": operation, "object": obj,
               "oldObject": copy.deepcopy(obj) if operation == "UPDATE" else None,
               "kind": {"group": GROUP, "version": VERSION, "kind": "PDDeployment"},
               "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
               "namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"],
               "userInfo": {}, "dryRun": False}
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    post = urllib.request.Request(url, method="POST", data=body.encode(),
                                  headers={"Content-Type": "application/json"})
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(post, context=tls, timeout=30) as answer:
            return answer.status, json.loads(answer.read())["response"]
    except urllib.error.HTTPError as err:
        return err.code, None


def test_reviews_over_one_mib_are_answered(webhook):
    # kopf's server alone answers 413 above aiohttp's 1 MiB default; the operator raises the limit.
    # An update review carries the object and the old one: two of 700 KiB make 1.4 MiB, which the
    # API server sends for an update of a large stored object. Posted here directly, as the API
    # server would, since storing a 700 KiB object first is beside the point.
    obj = api_server_object(example(FLEET_EXAMPLE), webhook.namespace)
    assert obj is not None
    obj["spec"]["model"]["hfConfig"] = {"padding": "z" * (700 * 1024)}
    status, response = admission_review(webhook.url, obj, "UPDATE")
    assert status == 200 and response is not None and response["allowed"] is False
    assert len(json.dumps(obj)) * 2 > MB


@pytest.mark.parametrize(("spec", "field"), [
    ({"model": {"weights": {"hostPath": {"path": "/"}}}}, "spec.model.weights.hostPath.path"),
    ({"decode": {"hostMounts": {"paths": [{"path": "/var/lib/kubelet/pods"}]}}},
     "spec.decode.hostMounts.paths[0].path"),
    ({"prefill": {"hostMounts": {"paths": [{"path": "/mnt/elsewhere"}]}}},
     "spec.prefill.hostMounts.paths[0].path"),
], ids=["weights-root", "kubelet", "not-allowed"])
def test_host_paths_are_refused_by_the_webhook_the_chart_configures(control_plane, webhook, spec, field):
    """The chart's hostPaths reach the operator as flags, and its webhook refuses a host path the
    node must not lend, naming the field (the CRD schema alone admits these)."""
    obj = api_server_object(copy.deepcopy(webhook.base), webhook.namespace)
    assert obj is not None
    obj["metadata"] = {"name": "host-paths", "namespace": webhook.namespace}
    for key, value in spec.items():
        if key == "model":
            obj["spec"]["model"]["weights"] = value["weights"]
        else:
            obj["spec"][key] = {**obj["spec"][key], **value}
    status, message = dry_run(control_plane, "POST",
                              f"/apis/{GROUP}/{VERSION}/namespaces/{webhook.namespace}/{PLURAL}", obj)
    assert status != 200 and WEBHOOK_DENIED in message, message
    assert f"{field}: " in message, message

"""`pd-operator run` (and `python -m pd_operator`): kopf with the operator's settings and flags.

The Helm chart passes exactly these flags; `--kubeconfig` is for running outside a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import pathlib
import random
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import kopf
import prometheus_client
from pydantic import ValidationError

from pd_operator.api import schema_check
from pd_operator.api.labels import FINALIZER
from pd_operator.api.types import GROUP, ClientPeer
from pd_operator.controller import admission, handlers, logs, webhook
from pd_operator.controller.client import connect
from pd_operator.controller.metrics import Metrics
from pd_operator.controller.runner import Runner
from pd_operator.render import Boundary, policy, runnable
from pd_operator.render.policy import CHART_DEFAULT
from pd_operator.serving_image.contents import DEFAULT_TOOLS_IMAGE
from pd_operator.spec import node_access
from pd_operator.spec.host_paths import DEFAULT, HostPathPolicy


@dataclass
class Options:
    namespaces: list[str] = field(default_factory=list)
    """Empty: all namespaces."""
    health_port: int = 8080
    metrics_port: int = 9090
    webhook: bool = True
    webhook_port: int = 9443
    webhook_cert_dir: str | None = None
    webhook_self_signed: bool = False
    webhook_config_name: str | None = None
    peering: str | None = None
    log_format: str = "plain"
    kubeconfig: str | None = None
    drift_interval_s: float = 30.0
    host_path_policy: HostPathPolicy = DEFAULT
    tools_image: str = DEFAULT_TOOLS_IMAGE
    boundary: Boundary = CHART_DEFAULT
    node_access: node_access.NodeAccess = node_access.DEFAULT


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="pd-operator", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace (default)")
    scope.add_argument("--namespace", "-n", action="append", default=[], dest="namespaces",
                       metavar="NS", help="serve this namespace (repeatable)")
    run.add_argument("--health-port", type=_port, default=8080, help="liveness endpoint /healthz")
    run.add_argument("--metrics-port", type=_port, default=9090, help="Prometheus endpoint /metrics")
    run.add_argument("--webhook-port", type=_port, default=9443)
    hook = run.add_mutually_exclusive_group()
    hook.add_argument("--webhook-cert-dir", metavar="DIR", help="directory with tls.crt and tls.key")
    hook.add_argument("--webhook-self-signed", action="store_true",
                      help="generate a CA and certificate at start")
    hook.add_argument("--no-webhook", action="store_true", help="serve no admission webhook")
    run.add_argument("--webhook-config-name", metavar="NAME",
                     help="ValidatingWebhookConfiguration whose caBundle and URL the operator manages "
                          "(with --webhook-self-signed)")
    run.add_argument("--peering", metavar="NAME", help="kopf peering object (default: standalone)")
    run.add_argument("--log-format", choices=("plain", "json"), default="plain")
    run.add_argument("--kubeconfig", metavar="PATH", help="default: in-cluster, else $KUBECONFIG")
    run.add_argument("--drift-interval", type=float, default=30.0, metavar="SECONDS",
                     help="reconcile an object nothing else reconciled for this long (default 30)")
    run.add_argument("--metrics-scraper", action="append", default=None, dest="scrapers", metavar="JSON",
                     help="a NetworkPolicy peer (JSON: namespaceSelector, podSelector or ipBlock) admitted "
                          "to the engines' serving port and the proxies' metrics port (repeatable; default: "
                          "none)")
    runnable.add_flags(run)
    return top


ADMIN_KEY_ENV = "PD_OPERATOR_PROXY_ADMIN_KEY"
"""The key each proxy's admin token is derived from (render/policy.py admin_token): the chart sets it
from its Secret `<release>-proxy-admin`. Unset: the proxies' admin ports want no token."""


def boundary_of(scrapers: list[str] | None, namespace: str, admin_key: str | None = None) -> Boundary:
    """The Boundary the operator renders with; ValueError naming the bad --metrics-scraper."""
    peers = []
    for text in scrapers or []:
        try:
            peers.append(ClientPeer.model_validate_json(text))
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the peer'}: {e['msg']}"
                                 for e in err.errors())
            raise ValueError(f"--metrics-scraper {text}: {problems}") from None
    return Boundary(namespace, tuple(peers), admin_key or None)


def options_from(argv: Sequence[str]) -> Options:
    top = parser()
    args = top.parse_args(argv)
    if args.webhook_config_name and not args.webhook_self_signed:
        top.error("--webhook-config-name needs --webhook-self-signed (cert-manager manages it otherwise)")
    if not args.no_webhook and not (args.webhook_cert_dir or args.webhook_self_signed):
        top.error("give --webhook-cert-dir DIR, --webhook-self-signed or --no-webhook")
    if args.drift_interval <= 0:
        top.error("--drift-interval must be positive")
    try:
        validator = runnable.options_of(args)
        boundary = boundary_of(args.scrapers, os.environ.get("POD_NAMESPACE") or policy.OPERATOR_NAMESPACE,
                               os.environ.get(ADMIN_KEY_ENV))
    except ValueError as err:
        top.error(str(err))
    if args.webhook_cert_dir:
        for name in ("tls.crt", "tls.key"):
            if not (pathlib.Path(args.webhook_cert_dir) / name).is_file():
                top.error(f"--webhook-cert-dir {args.webhook_cert_dir} has no {name}")
    return Options(namespaces=args.namespaces, health_port=args.health_port, metrics_port=args.metrics_port,
                   webhook=not args.no_webhook, webhook_port=args.webhook_port,
                   webhook_cert_dir=args.webhook_cert_dir, webhook_self_signed=args.webhook_self_signed,
                   webhook_config_name=args.webhook_config_name, peering=args.peering,
                   log_format=args.log_format, kubeconfig=args.kubeconfig,
                   drift_interval_s=args.drift_interval, boundary=boundary, **validator)


def settings_for(options: Options) -> kopf.OperatorSettings:
    """kopf's settings (the webhook is not kopf's: `serving_webhook`)."""
    settings = kopf.OperatorSettings()
    # Everything kopf writes onto objects carries the operator's own prefix.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = handlers.NoDiffBase()  # event handlers only: no diffs
    settings.posting.enabled = False  # the reconcile posts its own events, only on transitions
    handlers.watch_only_ours(settings)
    if options.peering:
        # kopf pauses every peer while another of the same priority is alive (kopf 1.45
        # peering.py), so equal replicas would all stand still: a random priority per process
        # makes the highest one work and the others wait as hot standbys.
        settings.peering.priority = random.randrange(1, 2**31)
    return settings


def serving_webhook(options: Options, workdir: pathlib.Path, health: webhook.WebhookHealth,
                    runner: Runner) -> webhook.Serving:
    """The admission webhook, in a process of its own, judging with the reconcile's validator settings."""
    # Not kopf's settings.admission.managed: webhook.py says why.
    where = webhook.endpoint(port=options.webhook_port, cert_dir=options.webhook_cert_dir, workdir=workdir,
                             config_name=options.webhook_config_name, namespaces=options.namespaces,
                             kubeconfig=options.kubeconfig, log_format=options.log_format)
    return webhook.Serving(where, functools.partial(
        admission.verdict, host_path_policy=runner.host_path_policy, tools_image=runner.tools_image,
        node_access=runner.node_access), health)


def run(options: Options, *, stop_flag: threading.Event | None = None,
        ready_flag: threading.Event | None = None) -> None:
    """Run until stopped (SIGINT/SIGTERM, or `stop_flag` when given)."""
    # Up front, once: the reconcile threads' first checks would each build cel-python's parser.
    schema_check.compile_rules()
    metrics = Metrics()
    client = connect(options.kubeconfig)
    runner = Runner(client, metrics, drift_interval_s=options.drift_interval_s,
                    host_path_policy=options.host_path_policy, tools_image=options.tools_image,
                    boundary=options.boundary,
                    node_access=options.node_access)
    registry = kopf.OperatorRegistry()
    health = webhook.WebhookHealth() if options.webhook else None
    handlers.register(registry, runner, webhook=health)
    server, thread = prometheus_client.start_http_server(options.metrics_port, registry=metrics.registry)
    try:
        with (tempfile.TemporaryDirectory(prefix="pd-operator-") as workdir,
              contextlib.ExitStack() as webhook_serving):
            if health is not None:
                webhook_serving.enter_context(serving_webhook(options, pathlib.Path(workdir), health, runner))
            asyncio.run(kopf.operator(
                registry=registry, settings=settings_for(options),
                standalone=options.peering is None, peering_name=options.peering,
                clusterwide=not options.namespaces, namespaces=options.namespaces,
                liveness_endpoint=f"http://0.0.0.0:{options.health_port}/healthz",
                stop_flag=stop_flag, ready_flag=ready_flag))
    finally:
        server.shutdown()
        thread.join(timeout=5)


def main(argv: Sequence[str] | None = None) -> int:
    options = options_from(sys.argv[1:] if argv is None else argv)
    logs.configure(options.log_format)
    run(options)
    return 0


if __name__ == "__main__":
    sys.exit(main())

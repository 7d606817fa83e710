"""pd-proxy's bounds as command-line options: one table, read by the server's parser and by the
renderer, so what spec.proxy.limits says and what the process runs with cannot drift. Defaults,
ranges and help text are the API's (api/types.py ProxyLimits): a bound out of range is refused by
the validator before it is rendered, and by pd-proxy itself when given by hand.
"""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from pd_operator.api.types import ProxyLimits

API_KEY_ENV = "PD_PROXY_API_KEY"
"""The API key clients must send and the engines get (render/proxy.py sets it from the Secret
spec.proxy.apiKey names; an environment variable, not an option, so it is not in the argv)."""

ADMIN_TOKEN_ENV = "PD_PROXY_ADMIN_TOKEN"
"""The token the admin port wants (`Authorization: Bearer <token>`; render/policy.py admin_token):
an environment variable, so it is not in the argv."""

FLAGS: dict[str, str] = {
    "--header-timeout": "header_timeout_seconds",
    "--body-timeout": "body_timeout_seconds",
    "--idle-timeout": "idle_timeout_seconds",
    "--answer-timeout": "answer_timeout_seconds",
    "--max-body-bytes": "max_body_bytes",
    "--max-buffered-bytes": "max_buffered_bytes",
    "--max-concurrent-requests": "max_concurrent_requests",
    "--max-client-connections": "max_client_connections",
    "--max-connections-per-source": "max_connections_per_source",
    "--max-retries": "max_retries",
    "--max-prefills": "max_prefills",
}
"""Option -> ProxyLimits field."""


def argv(limits: ProxyLimits) -> list[str]:
    """The options that run pd-proxy with `limits`."""
    return [word for flag, name in FLAGS.items() for word in (flag, str(getattr(limits, name)))]


def add_to(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("bounds (spec.proxy.limits)")
    for flag, name in FLAGS.items():
        info = ProxyLimits.model_fields[name]
        group.add_argument(flag, dest=name, type=type(info.default), default=info.default,
                           help=(info.description or "").replace("%", "%%"))


def limits_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ProxyLimits:
    """The bounds the parsed options give; exits with the parser's usage error naming the option when
    one is out of range."""
    try:
        return ProxyLimits(**{name: getattr(args, name) for name in FLAGS.values()})
    except ValidationError as err:
        by_field = {name: flag for flag, name in FLAGS.items()}
        problems = [f"{by_field.get(str(e['loc'][0]), '') if e['loc'] else ''} {e['msg']}".strip()
                    for e in err.errors()]
        parser.error("; ".join(problems))

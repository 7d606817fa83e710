"""What pd-proxy answers when it cannot forward an engine's answer as it is, and the failures that lead
there.

Error answers are OpenAI-style and name roles and instance names (`glm-flash-decode-1`), never
upstream URLs or DNS names; the log has the detail (an exception's text can carry both).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from aiohttp import web

from pd_operator.proxy.membership import Upstream

RETRY_AFTER_S = "1"
UPSTREAM_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
NOT_DELIVERED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""No connection was made: the member received nothing of the request."""


@dataclass(frozen=True)
class ErrorAnswer:
    """An upstream's answer of 400 or more: a 4xx goes to the client as it is, a 5xx is
    tried again on another member."""

    status: int
    body: bytes
    content_type: str | None

    @classmethod
    async def read(cls, resp: aiohttp.ClientResponse) -> ErrorAnswer:
        return cls(resp.status, await resp.read(), resp.headers.get("Content-Type"))


class Reprefill(Exception):
    """Decode failed after it may have pulled the request's KV: prefill the request again."""

    def __init__(self, answer: web.Response, why: str) -> None:
        super().__init__(why)
        self.answer, self.why = answer, why


class ClientStalled(Exception):
    """A client read nothing of its stream for the idle timeout."""


class BadRequest(Exception):
    """The client's request cannot be served as sent: its answer."""

    def __init__(self, answer: web.Response, close: bool = False) -> None:
        super().__init__(answer.text)
        if close:  # the rest of the body is not read: the connection cannot carry another request
            answer.force_close()
        self.answer = answer


def error(status: int, message: str, type_: str, headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI-style error answer."""
    return web.json_response({"error": {"message": message, "type": type_, "code": status}}, status=status,
                             headers=headers)


def invalid(status: int, message: str) -> web.Response:
    return error(status, message, "invalid_request_error")


def busy(message: str) -> web.Response:
    return error(503, message, "overloaded", {"Retry-After": RETRY_AFTER_S})


def forwarded(status: int, body: bytes, content_type: str | None) -> web.Response:
    headers = {"Content-Type": content_type or "application/json"}
    return web.Response(status=status, body=body, headers=headers)


def failure(role: str, upstream: Upstream, err: BaseException) -> web.Response:
    """The client's answer for a call that failed without an engine's answer: the instance by name
    and the kind of failure; the exception's text (URLs, DNS names) stays in the log."""
    if isinstance(err, TimeoutError):
        return error(504, f"{role} instance {upstream.name} did not answer in time", "upstream_timeout")
    return error(502, f"{role} instance {upstream.name} failed: {type(err).__name__}", "upstream_error")


def why(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"

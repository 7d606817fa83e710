"""The request bodies pd-proxy holds: a body must be JSON, at most --max-body-bytes, whole within
--body-timeout, and fit in --max-buffered-bytes with every other body held, else the request is
answered 4xx or 503 before its body is read (bodies over 1/64 of the budget may fill only three
quarters of it: stalled large uploads leave room for ordinary requests).
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from pd_operator.api.types import ProxyLimits
from pd_operator.proxy.answers import BadRequest, busy, invalid

SMALL_BODY_SHARE = 64
SMALL_RESERVE = 4
"""A body over 1/SMALL_BODY_SHARE of --max-buffered-bytes may not take its last 1/SMALL_RESERVE."""


class Bodies:
    """The body bytes held by requests in flight, within limits.max_buffered_bytes."""

    def __init__(self, limits: ProxyLimits) -> None:
        self.limits = limits
        self.buffered = 0

    async def read(self, request: web.Request) -> tuple[dict, int]:
        """The request's JSON object and the bytes reserved for it (the caller releases them).
        Raises BadRequest."""
        given = request.headers.get("Content-Type")
        if given is not None and not (request.content_type == "application/json"
                                      or request.content_type.endswith("+json")):
            raise BadRequest(invalid(415, "the body must be JSON (Content-Type application/json, not "
                                          f"{request.content_type[:64]})"))
        limit = self.limits.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise BadRequest(invalid(413, f"the body is {length} bytes; at most {limit}"), close=True)
        reserved = 0

        def reserve(n: int) -> None:
            nonlocal reserved
            if self.buffered + n > self._room(reserved + n):
                raise BadRequest(busy("the proxy holds as many request bodies as it may; retry later"),
                                 close=True)
            self.buffered += n
            reserved += n

        try:
            reserve(length or 0)
            data = bytearray()
            async with asyncio.timeout(self.limits.body_timeout_seconds):
                while chunk := await request.content.readany():
                    if len(data) + len(chunk) > limit:
                        raise BadRequest(invalid(413, f"the body is over {limit} bytes"), close=True)
                    if len(data) + len(chunk) > reserved:  # a chunked body, or longer than it said
                        reserve(len(data) + len(chunk) - reserved)
                    data += chunk
        except TimeoutError:
            self.release(reserved)
            late = f"the body did not arrive within {self.limits.body_timeout_seconds:g} s"
            raise BadRequest(invalid(408, late), close=True) from None
        except BaseException:
            self.release(reserved)
            raise
        try:
            body = json.loads(data)
        except RecursionError:
            problem = "the body is JSON nested too deeply"
        except ValueError:
            problem = "the body is not JSON"
        else:
            if isinstance(body, dict):
                return body, reserved
            problem = "the body is not a JSON object"
        self.release(reserved)
        raise BadRequest(invalid(400, problem))

    def release(self, reserved: int) -> None:
        """A request's body, read by `read`, is no longer held."""
        self.buffered -= reserved

    def _room(self, body: int) -> int:
        """What self.buffered may reach with a body of `body` bytes: large bodies may fill only part
        of the budget, so uploads of large bodies that stall (or crowd in) leave room for ordinary
        requests."""
        budget = self.limits.max_buffered_bytes
        return budget if body <= budget // SMALL_BODY_SHARE else budget - budget // SMALL_RESERVE

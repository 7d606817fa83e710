"""The one place the operator dials a pod: a proxy pod's state while a removed instance drains
(controller/drain.py). Not the Kubernetes API, so apart from controller/client.py.

Read defensively: `spec.proxy.image` is the tenant's, so whatever answers on a proxy pod's port may
be hostile, and the operator serves every tenant. Each read has a size cap (an answer larger than
MAX_ANSWER_BYTES is cut off, never held) and a TOTAL deadline (DEADLINE_S from connect to the last
byte: every socket read waits only for what is left of it, so a server dripping one byte at a time
cannot stretch the call). A proxy pod that misses either is unreachable, which the drain counts as
unknown: it holds the instance until the role's bound, as any unreadable proxy does. The pods of one
reconcile are read in parallel, so a reconcile spends at most about one deadline on them, whatever
their number, and holds its worker thread no longer (reconciles of other PDDeployments run meanwhile
on the runner's other threads, controller/runner.py).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from pd_operator.proxy.membership import STATE_PATH, ProxyState, parse_state

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

DEADLINE_S = 3.0
MAX_ANSWER_BYTES = 1 << 20
"""An honest answer is about 100 bytes per upstream (instance names are DNS labels of at most 63
characters), so 1 MiB leaves room for thousands of instances and costs the operator little."""
CHUNK = 64 << 10
PARALLEL = 8
"""Proxy pods read at once (across reconciles): more wait for a thread, each at most a deadline."""


class ProxyUnreachable(Exception):
    """A proxy pod's state could not be read (message: why). `refused`: the pod's address answered
    that nothing listens on the port, so no proxy process runs there to carry a request."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class _DeadlineSocket(socket.socket):
    """A socket whose every receive waits only for what is left until `deadline` (time.monotonic)."""

    deadline = 0.0

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        self.settimeout(left)
        return super().recv_into(buffer, nbytes, flags)


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, deadline: float) -> None:
        super().__init__(host, port)
        self.deadline = deadline

    def connect(self) -> None:
        sock = _DeadlineSocket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.deadline = self.deadline
        try:
            sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
            sock.connect((self.host, self.port))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class ProxyStateReader:
    def __init__(self, *, deadline_s: float = DEADLINE_S, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self._threads = ThreadPoolExecutor(PARALLEL, thread_name_prefix="proxy-state")

    def read(self, pod_ip: str, port: int, token: str | None = None) -> ProxyState:
        """A proxy pod's answer at STATE_PATH on its admin port, dialled directly (the proxy's
        NetworkPolicy admits the operator's namespace there; the answer changes too fast to go
        through the API), with the admin `token` when the proxy wants one. Raises ProxyUnreachable."""
        connection = _Connection(pod_ip, port, time.monotonic() + self.deadline_s)
        response = None
        try:
            headers = {"Accept": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            connection.request("GET", STATE_PATH, headers=headers)
            response = connection.getresponse()
            if response.status != 200:
                raise ProxyUnreachable(f"HTTP {response.status}")
            if response.length is not None and response.length > self.max_bytes:
                raise ProxyUnreachable(
                    f"an answer of {response.length} bytes, over the cap of {self.max_bytes} bytes")
            body = bytearray()
            while chunk := response.read(CHUNK):
                body += chunk
                if len(body) > self.max_bytes:
                    raise ProxyUnreachable(f"an answer over the cap of {self.max_bytes} bytes")
        except ConnectionRefusedError as err:
            raise ProxyUnreachable(f"connection refused: {err}", refused=True) from None
        except TimeoutError:
            raise ProxyUnreachable(f"no whole answer within {self.deadline_s:g} s") from None
        except (OSError, http.client.HTTPException) as err:
            raise ProxyUnreachable(f"{type(err).__name__}: {err}") from None
        finally:
            if response is not None:  # it holds the socket when the server said it closes
                response.close()
            connection.close()
        try:
            return parse_state(json.loads(body))
        except (ValueError, RecursionError) as err:  # RecursionError: JSON nested too deep
            raise ProxyUnreachable(f"unexpected answer: {str(err)[:200]}") from None

    def read_all(self, pods: Mapping[str, tuple[str, int]], token: str | None = None
                 ) -> dict[str, ProxyState | ProxyUnreachable]:
        """Every pod's state or why it could not be read, by pod name; `pods`: name -> (IP, port)."""
        futures = {name: self._threads.submit(self.read, ip, port, token)
                   for name, (ip, port) in pods.items()}
        out: dict[str, ProxyState | ProxyUnreachable] = {}
        for name, future in futures.items():
            try:
                out[name] = future.result()
            except ProxyUnreachable as err:
                out[name] = err
        return out

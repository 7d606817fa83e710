"""The one place the operator dials pods: a proxy pod's state while a removed instance drains
(controller/drain.py), and a decode pod's KV-link gate, which it pushes the newest membership to and
whose state it reads (transfer/gate_state.py). Not the Kubernetes API, so apart from
controller/client.py.

Read defensively: `spec.proxy.image` and `spec.image` are the tenant's, so whatever answers on a
proxy's or a gate's port may be hostile, and the operator serves every tenant. Each exchange has a
size cap (an answer larger than MAX_ANSWER_BYTES is cut off, never held) and a TOTAL deadline
(DEADLINE_S from connect to the last byte: every socket read waits only for what is left of it, so a
server dripping one byte at a time cannot stretch the call). A pod that misses either is unreachable,
which the drain counts as unknown: it holds the instance until the role's bound, as any unreadable
proxy or gate does. The pods of one reconcile are dialled in parallel (at most PARALLEL at once), so a
reconcile spends about one deadline on them, whatever their number, and holds its worker thread no
longer (reconciles of other PDDeployments run meanwhile on the runner's other threads,
controller/runner.py).
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from pd_operator.proxy.membership import STATE_PATH, ProxyState, parse_state
from pd_operator.spec.ports import PROBE_PORT
from pd_operator.transfer import gate_state
from pd_operator.transfer.gate_state import GateState

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

DEADLINE_S = 3.0
MAX_ANSWER_BYTES = 1 << 20
"""An honest answer is about 100 bytes per upstream (instance names are DNS labels of at most 63
characters), so 1 MiB leaves room for thousands of instances and costs the operator little."""
CHUNK = 64 << 10
PARALLEL = 8
"""Pods dialled at once (across reconciles): more wait for a thread, each at most a deadline."""
T = TypeVar("T")


class ProxyUnreachable(Exception):
    """A pod's answer could not be had (message: why). `refused`: the pod's address answered that
    nothing listens on the port, so no proxy (or gate) process runs there to route (or link)."""

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
    """Dials proxy pods (their state) and decode pods' gates (a membership push, their state)."""

    def __init__(self, *, deadline_s: float = DEADLINE_S, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self._threads = ThreadPoolExecutor(PARALLEL, thread_name_prefix="proxy-state")

    def read(self, pod_ip: str, port: int, token: str | None = None) -> ProxyState:
        """A proxy pod's answer at STATE_PATH on its admin port, dialled directly (the proxy's
        NetworkPolicy admits the operator's namespace there; the answer changes too fast to go
        through the API), with the admin `token` when the proxy wants one. Raises ProxyUnreachable."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return self._exchange(pod_ip, port, "GET", STATE_PATH, None, headers, parse_state)

    def push(self, pod_ip: str, document: dict, port: int = PROBE_PORT) -> GateState:
        """Hand a decode pod's KV-link gate the membership `document` on its probe port (the engines'
        NetworkPolicy admits the operator's namespace there); its state once applied. Raises
        ProxyUnreachable."""
        body = json.dumps(document).encode()
        return self._exchange(pod_ip, port, "POST", gate_state.MEMBERSHIP_PATH, body,
                              {"Content-Type": "application/json"}, gate_state.parse_state)

    def gate(self, pod_ip: str, port: int = PROBE_PORT) -> GateState:
        """A decode pod's KV-link gate state. Raises ProxyUnreachable."""
        return self._exchange(pod_ip, port, "GET", gate_state.STATE_PATH, None, {}, gate_state.parse_state)

    def _exchange(self, pod_ip: str, port: int, method: str, path: str, body: bytes | None,
                  headers: dict[str, str], parse: Callable[[object], T]) -> T:
        connection = _Connection(pod_ip, port, time.monotonic() + self.deadline_s)
        response = None
        try:
            connection.request(method, path, body=body, headers={"Accept": "application/json", **headers})
            response = connection.getresponse()
            if response.status != 200:
                raise ProxyUnreachable(f"HTTP {response.status}")
            if response.length is not None and response.length > self.max_bytes:
                raise ProxyUnreachable(
                    f"an answer of {response.length} bytes, over the cap of {self.max_bytes} bytes")
            answer = bytearray()
            while chunk := response.read(CHUNK):
                answer += chunk
                if len(answer) > self.max_bytes:
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
            return parse(json.loads(answer))
        except (ValueError, RecursionError) as err:  # RecursionError: JSON nested too deep
            raise ProxyUnreachable(f"unexpected answer: {str(err)[:200]}") from None

    def read_all(self, pods: Mapping[str, tuple[str, int]], token: str | None = None
                 ) -> dict[str, ProxyState | ProxyUnreachable]:
        """Every proxy pod's state or why it could not be read, by pod name; `pods`: name -> (IP, port)."""
        return self._all({name: functools.partial(self.read, ip, port, token)
                          for name, (ip, port) in pods.items()})

    def push_all(self, pods: Mapping[str, str], document: dict) -> dict[str, GateState | ProxyUnreachable]:
        """push() to every decode pod, by pod name; `pods`: name -> IP."""
        return self._all({name: functools.partial(self.push, ip, document) for name, ip in pods.items()})

    def _all(self, calls: Mapping[str, Callable[[], T]]) -> dict[str, T | ProxyUnreachable]:
        futures = {name: self._threads.submit(call) for name, call in calls.items()}
        out: dict[str, T | ProxyUnreachable] = {}
        for name, future in futures.items():
            try:
                out[name] = future.result()
            except ProxyUnreachable as err:
                out[name] = err
        return out

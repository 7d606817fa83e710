"""The one place the operator dials a pod: a proxy pod's state while a removed instance drains
(controller/drain.py). Not the Kubernetes API, so apart from controller/client.py.
"""

from __future__ import annotations

import json

import urllib3

from pd_operator.proxy.membership import STATE_PATH, ProxyState, parse_state

TIMEOUT_S = 3.0


class ProxyUnreachable(Exception):
    """A proxy pod's state could not be read (message: why). `refused`: the pod's address answered
    that nothing listens on the port, so no proxy process runs there to carry a request."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class ProxyStateReader:
    def __init__(self) -> None:
        self._pods = urllib3.PoolManager(num_pools=4, maxsize=2)

    def read(self, pod_ip: str, port: int) -> ProxyState:
        """A proxy pod's answer at STATE_PATH, dialled directly (the NetworkPolicy does not select the
        proxy, and the answer changes too fast to go through the API). Raises ProxyUnreachable."""
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        try:
            response = self._pods.request("GET", f"http://{host}:{port}{STATE_PATH}",
                                          timeout=TIMEOUT_S, retries=False)
        except urllib3.exceptions.HTTPError as err:
            refused = isinstance(err.__cause__, ConnectionRefusedError)
            raise ProxyUnreachable(f"{type(err).__name__}: {err}", refused=refused) from None
        if response.status != 200:
            raise ProxyUnreachable(f"HTTP {response.status}")
        try:
            return parse_state(json.loads(response.data))
        except ValueError as err:
            raise ProxyUnreachable(f"unexpected answer: {err}") from None

"""Pod DNS for a process the tests run "in" a kwok pod (support/podnet.py). Test-only.

In a cluster, a pod resolves `<pod>.<service>.<namespace>.svc` through CoreDNS, which answers from
the API (a headless Service's pods, by hostname and subdomain). Here nothing serves the cluster
domain, so this wrapper runs a console script (e.g. `pd-proxy`) with `socket.getaddrinfo`, which
asyncio's and aiohttp's default (threaded) resolver call, answering cluster names from a file the
harness keeps in step with the API:

    python poddns.py HOSTS_FILE PROGRAM [ARGS...]

HOSTS_FILE is JSON, {"<pod>.<service>.<namespace>.svc": "<pod IP>"}, re-read at every lookup (the
harness replaces it atomically when pods come and go). A cluster name it lacks does not exist (as
CoreDNS answers NXDOMAIN); every other name resolves as usual. The program runs unchanged.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

CLUSTER_DOMAIN = ".cluster.local"
SERVICES = ".svc"


def pod_resolver(hosts: Path, resolve: Callable[..., Any]) -> Callable[..., Any]:
    """getaddrinfo answering cluster names from `hosts`, the rest with `resolve`."""
    def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                    flags: int = 0) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str):
            name = name.rstrip(".").removesuffix(CLUSTER_DOMAIN)
            if name.endswith(SERVICES):
                address = json.loads(hosts.read_text()).get(name)
                if address is None:
                    raise socket.gaierror(socket.EAI_NONAME, f"{host}: no such pod (pod DNS from {hosts})")
                host = address
        return resolve(host, port, family, type, proto, flags)
    return getaddrinfo


def main(argv: list[str]) -> int:
    hosts, program, *args = argv
    socket.getaddrinfo = pod_resolver(Path(hosts), socket.getaddrinfo)
    (script,) = entry_points(group="console_scripts", name=program)
    sys.argv = [program, *args]
    return int(script.load()() or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The real node's cluster DNS: the names Kubernetes' DNS specification gives Services and their pods
(kubernetes/dns: docs/specification.md @ 1.0.0, A records), answered from the API server's
EndpointSlices, so pods resolve the names the operator renders.

    python -m support.clusterdns --listen IP --server URL --token-file F --ca-file F [--domain D]

- `<service>.<namespace>.svc.<domain>`: the ready endpoints' addresses, for a headless Service as
  the specification says, and for a ClusterIP Service too: no kube-proxy runs on the node, so a
  ClusterIP would not route (what docs/tests.md says the node does not cover);
- `<hostname>.<service>.<namespace>.svc.<domain>`: an endpoint's address by its hostname (a
  StatefulSet's pods through their headless Service).
Other names under the domain are NXDOMAIN, names outside it REFUSED (the node has no upstream);
AAAA and other types of a known name are answered with no record. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import struct
import time
import urllib.request

A, IN = 1, 1
NOERROR, NXDOMAIN, REFUSED = 0, 3, 5
REFRESH_S = 0.5
TTL = 5


class Records:
    """Name -> addresses, from every EndpointSlice, refreshed at most every REFRESH_S."""

    def __init__(self, server: str, token: str, ca_file: str, domain: str) -> None:
        self.server, self.token, self.domain = server, token, domain
        self.context = ssl.create_default_context(cafile=ca_file)
        self.names: dict[str, list[str]] = {}
        self.fetched = 0.0

    def lookup(self, name: str) -> list[str] | None:
        if time.monotonic() - self.fetched > REFRESH_S:
            self.names = self._fetch()
            self.fetched = time.monotonic()
        return self.names.get(name.lower().rstrip("."))

    def _fetch(self) -> dict[str, list[str]]:
        request = urllib.request.Request(f"{self.server}/apis/discovery.k8s.io/v1/endpointslices",
                                         headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, context=self.context, timeout=10) as answer:
            slices = json.load(answer)["items"]
        names: dict[str, list[str]] = {}
        for item in slices:
            service = item["metadata"].get("labels", {}).get("kubernetes.io/service-name")
            if not service or item.get("addressType") != "IPv4":
                continue
            base = f"{service}.{item['metadata']['namespace']}.svc.{self.domain}"
            names.setdefault(base, [])
            for endpoint in item.get("endpoints") or []:
                if not (endpoint.get("conditions") or {}).get("ready"):
                    continue
                names[base] += endpoint["addresses"]
                if endpoint.get("hostname"):
                    names.setdefault(f"{endpoint['hostname']}.{base}", []).extend(endpoint["addresses"])
        return names


def parse_question(packet: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end of the question) of a query."""
    ident, flags = struct.unpack("!HH", packet[:4])
    labels, at = [], 12
    while packet[at]:
        length = packet[at]
        labels.append(packet[at + 1:at + 1 + length].decode("ascii", "replace"))
        at += 1 + length
    qtype, _ = struct.unpack("!HH", packet[at + 1:at + 5])
    return ident, flags, ".".join(labels), qtype, at + 5


def answer(packet: bytes, records: Records) -> bytes:
    ident, flags, name, qtype, end = parse_question(packet)
    question = packet[12:end]
    addresses = records.lookup(name) if name.lower().rstrip(".").endswith(records.domain) else None
    if name.lower().rstrip(".").endswith(records.domain):
        code = NOERROR if addresses is not None else NXDOMAIN
    else:
        code = REFUSED
    rows = addresses if code == NOERROR and qtype == A else []
    header = struct.pack("!HHHHHH", ident, 0x8000 | (flags & 0x0100) | 0x0400 | code, 1, len(rows), 0, 0)
    body = b"".join(struct.pack("!HHHIH", 0xC00C, A, IN, TTL, 4) + socket.inet_aton(ip) for ip in rows)
    return header + question + body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--port", type=int, default=53)
    parser.add_argument("--server", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--ca-file", required=True)
    parser.add_argument("--domain", default="cluster.local")
    args = parser.parse_args()
    with open(args.token_file) as token:
        records = Records(args.server, token.read().strip(), args.ca_file, args.domain)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.listen, args.port))
    print(f"clusterdns: serving {args.domain} on {args.listen}:{args.port}", flush=True)
    while True:
        packet, client = sock.recvfrom(512)
        try:
            sock.sendto(answer(packet, records), client)
        except (OSError, ValueError, IndexError, struct.error) as err:
            print(f"clusterdns: {client}: {err}", flush=True)


if __name__ == "__main__":
    main()

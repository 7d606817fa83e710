"""Loopback helpers for processes this package starts locally (demo, benches, tests, the probe)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's pick for an ephemeral bind)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

"""An HTTP server that answers as a hostile or broken proxy pod could (`spec.proxy.image` is the
tenant's): for the operator's proxy-state reader (controller/proxy_state.py), in unit tests and on
a kwok proxy pod's loopback IP in the integration tier.

    with Misbehaving("127.0.0.1", port, "flood") as server:   # 300 MiB as fast as the client reads
        ...
        server.connections, server.sent                       # what it saw and sent so far

Modes (every one answers any request, once per connection):
- `flood`: 200 with a Content-Length of FLOOD_BYTES, then that many bytes of JSON whitespace;
- `flood-unsized`: the same without Content-Length (HTTP/1.0, ends when the server closes);
- `drip`: `body` (a valid answer by default), status line and headers included, one byte every
  `interval` seconds;
- `answer`: `body` at once, as a sound proxy pod does;
- `nested`: a 200 whose body is JSON nested NESTED_DEPTH deep (small, but too deep to parse);
- `silent`: accepts, reads the request, answers nothing.
Threads, not asyncio: the reader under test blocks, and the server must go on meanwhile.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

FLOOD_BYTES = 300 << 20
NESTED_DEPTH = 200_000
CHUNK = b" " * (64 << 10)
IDLE = b'{"version": null, "upstreams": {}}'


@dataclass
class Misbehaving:
    host: str
    port: int
    mode: str
    body: bytes | Callable[[], bytes] = IDLE
    """What `answer` and `drip` send; a callable is asked for it at each connection."""
    interval: float = 2.0
    connections: int = 0
    sent: int = 0
    """Bytes sent over every connection (headers included)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Misbehaving:
        self._listener = socket.create_server((self.host, self.port), reuse_port=False)
        self._listener.settimeout(0.2)
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._listener.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                self.connections += 1
            self._spawn(self._serve, conn)

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.sent += len(data)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    request += chunk
                self._answer(conn)
            except OSError:
                pass  # the client hung up: that is what a well-defended client does

    def _answer(self, conn: socket.socket) -> None:
        body = self.body() if callable(self.body) else self.body
        if self.mode in ("flood", "flood-unsized"):
            sized = self.mode == "flood"
            head = ("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {FLOOD_BYTES}\r\n\r\n" if sized
                    else "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n")
            self._send(conn, head.encode())
            left = FLOOD_BYTES
            while left > 0 and not self._stop.is_set():
                self._send(conn, CHUNK[:left])
                left -= len(CHUNK)
        elif self.mode == "drip":
            answer = self._head(len(body)) + body
            for i in range(len(answer)):
                if self._stop.wait(self.interval if i else 0):
                    return
                self._send(conn, answer[i:i + 1])
        elif self.mode == "answer":
            self._send(conn, self._head(len(body)) + body)
        elif self.mode == "nested":
            body = b"[" * NESTED_DEPTH + b"]" * NESTED_DEPTH
            self._send(conn, self._head(len(body)) + body)
        elif self.mode == "silent":
            self._stop.wait()
        else:
            raise ValueError(f"mode: {self.mode!r}")

    @staticmethod
    def _head(length: int) -> bytes:
        return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
                "Connection: close\r\n\r\n").encode()

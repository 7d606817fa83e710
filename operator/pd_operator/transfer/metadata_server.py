"""The HTTP metadata server shipped in the Mooncake package, run as a child process.

`mooncake_http_metadata_server --host H --port N` serves `http://H:N/metadata` (facts.md section 3);
engines given that URL publish and look up segment descriptors there instead of handshaking.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pd_operator.localnet import free_port

SCRIPT = "mooncake_http_metadata_server"


class MetadataServerError(RuntimeError):
    pass


def _script() -> str:
    beside = Path(sys.executable).with_name(SCRIPT)  # the venv this interpreter belongs to
    found = str(beside) if beside.exists() else shutil.which(SCRIPT)
    if not found:
        raise MetadataServerError(f"{SCRIPT} not found; install mooncake-transfer-engine-non-cuda")
    return found


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}?key=probe", timeout=1).close()
    except urllib.error.HTTPError:
        return True  # 404 for an unknown key: the server is up
    except OSError:
        return False
    return True


@contextmanager
def http_metadata_server(host: str = "127.0.0.1", port: int | None = None,
                         timeout: float = 20.0) -> Iterator[str]:
    """Run the server until the block ends; yields its metadata URL."""
    port = port or free_port(host)
    url = f"http://{host}:{port}/metadata"
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below, after the server) a file, not a pipe: a long-lived server must never block on it
    proc = subprocess.Popen([_script(), "--host", host, "--port", str(port), "--log-level", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + timeout
        while not _answers(url):
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")[-500:]
                raise MetadataServerError(f"{SCRIPT} exited with {proc.returncode}: {err}")
            if time.monotonic() > deadline:
                raise MetadataServerError(f"{SCRIPT} did not answer at {url} within {timeout} s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

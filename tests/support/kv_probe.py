"""`pd-kv-probe` processes on loopback for the transfer tier: the command, its environment, a `serve`
side started and waited for, and a rendered pod's sidecar command run as its pod would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from pd_operator.proxy.membership import MOUNT_DIR
from pd_operator.render.command import CONFIG_DIR
from pd_operator.serving_image import bundle
from support.cluster import pick_port

PROBE = [sys.executable, "-m", "pd_operator.transfer.probe"]
ENV_LOOPBACK = {"MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "ERROR"}
LOOPBACK = ["--local-hostname", "127.0.0.1"]


def env() -> dict[str, str]:
    return {**os.environ, **ENV_LOOPBACK}


def serve(pairing: list[str]) -> tuple[subprocess.Popen, str]:
    """A `pd-kv-probe serve` of `pairing`, once its buffer is registered: (process, host:port)."""
    port = pick_port()
    proc = subprocess.Popen([*PROBE, "serve", *pairing, *LOOPBACK,
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env())
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once the buffer is registered and the endpoint is up
    assert line, f"serve exited with {proc.wait()}"
    assert json.loads(line)["serving"] == f"http://127.0.0.1:{port}/descriptor"
    return proc, f"127.0.0.1:{port}"


VENV_BIN = Path(sys.executable).parent


class Sidecar:
    """One sidecar command of a rendered pod, running, with its stdout lines collected."""

    def __init__(self, cont: dict, mounted: Path, port: int, extra: list[str] | None = None,
                 membership: Path | None = None) -> None:
        """`mounted`: the serving ConfigMap's files; `membership`: the proxy membership ConfigMap's."""
        tools = mounted / "pd-tools"  # where the init container would have put the tools bundle
        if not tools.exists():
            bundle.write(tools)
        command = [arg.replace(CONFIG_DIR, str(mounted)).replace(bundle.MOUNT, str(tools))
                   .replace(MOUNT_DIR, str(membership or MOUNT_DIR)) for arg in cont["command"]]
        command[command.index("--port") + 1] = str(port)
        if "--every" in command:
            command[command.index("--every") + 1] = "1"
        env = {**os.environ, "PATH": f"{VENV_BIN}:/usr/bin:/bin", "MC_TCP_BIND_ADDRESS": "127.0.0.1",
               "MC_LOG_LEVEL": "ERROR",
               **{e["name"]: e["value"] for e in cont["env"] if "value" in e}, "POD_IP": "127.0.0.1"}
        self.proc = subprocess.Popen([*command, *(extra or [])], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def kubelet_ready(cont: dict, port: int) -> bool:
    """The rendered readinessProbe (httpGet) as the kubelet runs it: 2xx is ready."""
    probe = cont["readinessProbe"]["httpGet"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe['path']}", timeout=10) as answer:
            return 200 <= answer.status < 300
    except urllib.error.HTTPError:
        return False
    except OSError:
        return False

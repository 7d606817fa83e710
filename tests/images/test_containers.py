"""The podman harness itself (tests/support/containers.py): what the `images` tier relies on when it
runs a container as a kubelet would. A background container gets the SIGTERM that stopping it sends
(as a pod's process gets the kubelet's) and is gone afterwards, so a test's stop() is a graceful
shutdown and leaves nothing running; the configured limits are the ones runc can set here.
"""

from __future__ import annotations

import pytest

from support import containers
from support.cluster import wait_for

pytestmark = pytest.mark.images

WAITS_FOR_TERM = ("import signal, sys\n"
                  "signal.signal(signal.SIGTERM, lambda *_: (print('terminated', flush=True), sys.exit(3)))\n"
                  "print('up', flush=True)\n"
                  "signal.pause()\n")


@pytest.fixture(scope="module")
def base() -> str:
    return containers.base_image()


def test_a_background_container_is_stopped_with_sigterm_and_removed(base, tmp_path):
    with containers.Container(base, ["python3", "-c", WAITS_FOR_TERM], log=tmp_path / "c.log") as box:
        wait_for("the container's process", lambda: "up" in box.logs().splitlines(), 60, alive=[box])
        assert containers.podman("container", "exists", box.container, check=False).returncode == 0
        assert box.stop() == 3
    assert "terminated" in box.logs().splitlines()
    assert containers.podman("container", "exists", box.container, check=False).returncode == 1


def test_a_killed_container_is_removed(base, tmp_path):
    box = containers.Container(base, ["python3", "-c", WAITS_FOR_TERM], log=tmp_path / "c.log")
    box.start()
    wait_for("the container's process", lambda: "up" in box.logs().splitlines(), 60, alive=[box])
    box.kill()
    assert not box.running() and "terminated" not in box.logs().splitlines()
    assert containers.podman("container", "exists", box.container, check=False).returncode == 1


def test_runc_sets_the_configured_limits(base):
    done = containers.run(base, "python3", "-c", "import resource as r; "
                          "print(*r.getrlimit(r.RLIMIT_NOFILE), *r.getrlimit(r.RLIMIT_NPROC))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["20000", "20000", "32768", "32768"]

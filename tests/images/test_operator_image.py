"""The operator image, built from images/operator/Dockerfile and run as the chart runs it.

test_dockerfiles.py reads the Dockerfile; this builds it with podman (on the locally made Debian base:
no registry here) and runs the container against the test control plane with the chart's command,
arguments, env and securityContext (read-only root, non-root, no capabilities, no new privileges) and
the ServiceAccount token where a pod finds it, with no kubeconfig: the in-cluster configuration a
real pod uses. It must reconcile a PDDeployment to Ready, and every write must be the chart's
ServiceAccount's. A missing dependency, a console script that is not on PATH, a write to the root
filesystem or a need for root fails here, where the unit tiers (running from the developer's venv)
cannot see it.
"""

from __future__ import annotations

import json

import pytest

from pd_operator.api.types import GROUP, PLURAL, VERSION
from support import containers
from support.cluster import wait_for
from support.installed import condition, get_pdd, is_ready, wait_webhook_called, weights_claim
from support.specs import example

pytestmark = pytest.mark.images

# One of the examples test_helm_install.py reconciles to Ready with the operator as a local process.
EXAMPLE = "glm-5.3-flash-1p1d-tp4.yaml"
READY_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def operator_image() -> str:
    return containers.build(*containers.OPERATOR)


def proc_status(container: str) -> dict[str, str]:
    """/proc/1/status of the container's main process (the operator), read from inside it."""
    done = containers.podman("exec", container, "cat", "/proc/1/status")
    return dict(line.split(":\t", 1) for line in done.stdout.splitlines() if ":\t" in line)


def test_operator_image_reconciles_a_pddeployment_as_the_chart_runs_it(
        control_plane, namespace, release, operator_image, tmp_path):
    """`release`: the chart installed by helm (support.fixtures), uninstalled after the module."""
    cp = control_plane
    mark = cp.audit.mark()
    with release.operator_container(cp, tmp_path, operator_image) as op:
        op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "the webhook configured")
        wait_webhook_called(cp, namespace)

        # The process runs as the chart's securityContext says, whatever the image's defaults.
        (deployment,) = release.find("Deployment")
        pod_context = deployment["spec"]["template"]["spec"]["securityContext"]
        status = proc_status(op.container)
        assert status["Uid"].split()[0] == str(pod_context["runAsUser"]) != "0"
        assert status["Gid"].split()[0] == str(pod_context["runAsGroup"])
        assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"].strip() == "1"
        written = containers.podman("exec", op.container, "python3", "-c", "open('/probe', 'w')", check=False)
        assert written.returncode != 0 and "Read-only file system" in written.stderr, written.stderr
        (inspected,) = json.loads(containers.podman("inspect", op.container).stdout)
        assert inspected["Config"]["Image"] == operator_image
        assert not any(a.startswith("--kubeconfig") for a in inspected["Config"]["Cmd"])

        doc = example(EXAMPLE, namespace)
        name = doc["metadata"]["name"]
        claim = weights_claim(doc)
        assert claim
        cp.create_weights_volume(namespace, claim)
        cp.api("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}", doc)
        try:
            wait_for(f"{name} Ready=True", lambda: is_ready(cp, namespace, name), READY_TIMEOUT_S,
                     interval=1, alive=[op])
        except (TimeoutError, RuntimeError) as err:
            ready = condition(get_pdd(cp, namespace, name), "Ready")
            raise AssertionError(f"{err}\nReady: {ready}\n{op.output()[-4000:]}") from None

    # The children and the status were written as the chart's ServiceAccount, and by nobody else (the
    # user created the PDDeployment; controllers write only other objects, such as the StatefulSet
    # controller's own ControllerRevisions beside ours, and status subresources).
    writes = [e for e in cp.audit.events(mark, namespace=namespace) if e.write and e.name.startswith(name)]
    by_operator = {e.resource for e in writes if e.user == release.user}
    assert {"statefulsets", "services", "configmaps", "deployments", "controllerrevisions",
            "pddeployments/status"} <= by_operator
    owned = {(e.resource, e.name) for e in writes if e.user == release.user and e.resource != "pddeployments"}
    others = [str(e) for e in writes if e.user != release.user and (e.resource, e.name) in owned]
    assert not others, others
    assert not cp.audit.forbidden(mark, user=release.user)


# What the final image must not carry: an installer (pip, setuptools, wheel), or ensurepip and the
# wheels it (or Debian's python3-venv) installs them from. Checked under the venv's python3 and the
# base image's.
NO_INSTALLER = """
import importlib.util, json, pathlib, sys
modules = [m for m in ("pip", "setuptools", "wheel", "ensurepip") if importlib.util.find_spec(m)]
wheels = [str(p) for root in ("/usr", "/opt") for p in pathlib.Path(root).rglob("*.whl")]
print(json.dumps({"python": sys.executable, "modules": modules, "wheels": wheels}))
"""


def test_operator_image_keeps_no_installer(operator_image):
    found = []
    for python in ("/opt/pd-operator/bin/python3", "/usr/bin/python3", "/usr/local/bin/python3"):
        ran = containers.run(operator_image, "-c", NO_INSTALLER, options=["--entrypoint", python])
        if ran.returncode == 127 or "no such file" in ran.stderr.lower():
            continue  # the base has no python3 there
        assert ran.returncode == 0, ran.stderr
        found.append(json.loads(ran.stdout))
    assert len(found) >= 2, "the venv's and the base's python3 both ran"
    assert all(f["modules"] == [] and f["wheels"] == [] for f in found), found

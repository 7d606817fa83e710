"""`make demo` on the real node: the plan, the apply, the pods Running in containerd, a completion
answered through pd-proxy with the KV bytes moved between the pods and verified, each step's time."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from support import demo
from support.cluster import kubernetes_version
from support.node import NodeCluster

pytestmark = pytest.mark.node

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
CRD = pathlib.Path(__file__).resolve().parents[2] / "crds" / "pd.serving.dev_pddeployments.yaml"


# Its own timeout: importing the four images into a new node's containerd (podman save, ctr import)
# takes about 5 minutes of a loaded 2-core machine before the journey starts.
@pytest.mark.timeout(1800)
def test_demo_serves_a_completion_with_kv_verified_on_the_real_node(node_cluster: NodeCluster, capsys):
    assert demo.demo(str(EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml"), node_cluster) == 0
    out = capsys.readouterr().out
    print(out)
    lines = out.splitlines()
    wide = lines.index("== kubectl get nodes -o wide")
    node = lines[wide + 2].split()
    assert node[0] == node_cluster.node.name and node[1] == "Ready"
    assert kubernetes_version() in node and any(word.startswith("containerd://2.") for word in node)
    assert any(line.startswith("== helm install pd-operator charts/pd-operator") for line in lines)
    table = next(i for i, line in enumerate(lines) if line.startswith("== kubectl get pdd"))
    header, row = lines[table + 1], lines[table + 2]
    columns = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["additionalPrinterColumns"]
    assert header.split() == ["NAME", *(c["name"].upper() for c in columns)]
    assert row.split()[:6] == ["glm-flash", "1xTP8", "1xDP2xTP4", "True", "True", "Serving"]
    pods = [line.split() for line in lines if line.startswith("glm-flash-") and " Running " in line]
    assert len(pods) == 3 and all(p[1].split("/")[0] == p[1].split("/")[1] for p in pods)
    assert all(node_cluster.node.name in p for p in pods)
    listed = lines.index(next(line for line in lines if line.startswith("== containerd on")))
    running = {line.split()[0] for line in lines[listed + 1:] if " RUNNING " in line}
    assert running == {p[0] for p in pods}
    answered = next(line for line in lines if line.startswith("HTTP "))
    assert answered.startswith("HTTP 200: ") and "'text': 't0 t1 " in answered
    verified = next(line for line in lines if line.startswith("verified "))
    assert int(verified.split()[1]) > 0
    timed = lines.index("== how long each step took")
    steps = [line.split(":")[0] for line in lines[timed + 1:] if line.endswith(" s")]
    assert steps == ["import the images into containerd", "helm install, the operator's pod Ready",
                     "kubectl apply -f " + str(EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml"),
                     "the PDDeployment Ready", "a completion through pd-proxy"]

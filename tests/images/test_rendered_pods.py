"""Every rendered pod of every example, run in the images its containers name (issue 24, 3(b) and 3(c)).

For each serving pod the init container runs first, in the operator image (built from
images/operator), as the pod spec says (its user, read-only root, no capabilities): `pd-bundle` copies
the tools bundle into the pod's shared directory. The second init container, `pd-image-report`, runs
in the serving image and writes what its vllm-ascend is where the kubelet reads a termination message
(a file of the test's mounted there): the operator's reading of it names the release the spec claims,
and the seed change exactly when the spec claims it. Then the engine container runs in the image it names,
the stock-serving stand-in for stock vllm-ascend tags (its python3 is the release images' 3.12, with what
vLLM brings, and nothing of ours), with the rendered command, env (downward API filled in), the
ConfigMaps' files where they are mounted and the NPUs the device plugin would grant: the preflight must
pass and exec the recorder `vllm` with the rendered argv. Run once without the init step, the same
container must fail before `vllm serve`: the bundle is the only pd_operator it can find. The probe
sidecar runs in the same image and must reach its loop: prefill `serve` publishes its descriptor,
decode `gate` runs rounds and answers /ready (503: its peers' names do not resolve here).

The proxy container runs in the operator image as rendered (user, read-only root) on the host's
network and serves a request through fake prefill and decode engines (support.fakevllm), reading its
membership from the mounted file (no ServiceAccount token here: the watch's fallback).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pd_operator.proxy.membership import KEY, document
from pd_operator.render import render
from pd_operator.render.runnable import validate
from pd_operator.serving_image import bundle
from pd_operator.serving_image.installed import read_report
from pd_operator.spec.ports import PROBE_PORT, PROBE_READY_PATH
from support import containers
from support.cluster import wait_for
from support.fakevllm import HOST, FakeEngine, ProxyProcess, pick_port, started, swap
from support.renders import VALID_EXAMPLES, config_map_data, container, npu_count, of_kind, serving_sets
from support.specs import example

pytestmark = pytest.mark.images

RECORDS = "/pd-test"  # where the recorder `vllm` writes the argv it got (a directory of the test's)
PROBE_START_S = 120


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Rendered image -> local image, built (seconds when warm)."""
    return {"tools": containers.build(*containers.OPERATOR),
            "stock": containers.build(*containers.STOCK_SERVING),
            "seed": containers.build(*containers.SEED_SERVING)}


def rendered(path: Path, tools_image: str) -> list[dict]:
    result = validate(example(path), tools_image=tools_image)
    assert result.resolved is not None, [f.line() for f in result.errors]
    return render(result.resolved)


def local_image(images: dict[str, str], manifests: list[dict], image: str) -> str:
    """The local image a rendered one runs as: the tools image is the operator image built here; a
    serving image the stand-in (with the seed change's tree when the spec claims it)."""
    if image == images["tools"]:
        return image
    claimed = json.loads(config_map_data(manifests)["pairing.json"])["spec"]["image"]
    assert image == claimed["name"], image
    return images["seed" if claimed.get("seedChange") else "stock"]


class Pod:
    """One pod's shared state on this machine: a directory per volume (the tools emptyDir shared by its
    containers, the ConfigMaps' files, empty host paths and weights) and where `vllm` records."""

    def __init__(self, manifests: list[dict], sts: dict, ordinal: int, work: Path) -> None:
        self.spec, self.ordinal, self.work = sts["spec"]["template"]["spec"], ordinal, work
        self.sources: dict[str, Path] = {}
        data = {m["metadata"]["name"]: m["data"] for m in of_kind(manifests, "ConfigMap")}
        for volume in self.spec["volumes"]:
            name = volume["name"]
            if "emptyDir" in volume and name != "pd-tools":
                continue  # a tmpfs of each container's own
            path = work / "volumes" / name
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)  # the init container writes as the operator image's user
            for key, text in data.get((volume.get("configMap") or {}).get("name"), {}).items():
                (path / key).write_text(text)
            self.sources[name] = path
        self.records = work / "records"
        self.records.mkdir(exist_ok=True)
        self.records.chmod(0o777)

    def options(self, cont: dict, *extra: str) -> tuple[list[str], list[str]]:
        fields = {"status.podIP": "127.0.0.1",
                  "metadata.labels['apps.kubernetes.io/pod-index']": str(self.ordinal)}
        entry, args = containers.command_options(cont)
        granted = npu_count(cont) if "resources" in cont else 0
        npus = ["--env", f"ASCEND_VISIBLE_DEVICES={','.join(map(str, range(granted)))}"] if granted else []
        return [*containers.security_options(self.spec, cont), *containers.env_options(cont, fields),
                *containers.volume_options(self.spec, cont, self.sources), *npus,
                "--volume", f"{self.records}:{RECORDS}", "--env", f"PD_TEST_ARGV={RECORDS}/argv.json",
                *entry, *extra], args

    def run(self, cont: dict, image: str, *extra: str) -> containers.Ran:
        """Run a container to its end, in a network namespace of its own (ports here are not its)."""
        options, args = self.options(cont, "--network", "none", *extra)
        return containers.run(image, *args, options=options, timeout=120)

    def recorded(self) -> list[str] | None:
        path = self.records / "argv.json"
        return json.loads(path.read_text()) if path.exists() else None


def per_pod_flags(argv: list[str], replicas: int, ordinal: int) -> list[str]:
    """What a multi-pod instance's shell prelude appends for pod `ordinal` (render/command.py)."""
    if replicas == 1:
        return []
    local = int(argv[argv.index("--data-parallel-size-local") + 1])
    return [*(["--headless"] if ordinal else []), "--data-parallel-start-rank", str(ordinal * local)]


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_every_serving_pod_starts_in_the_images_it_names(path, images, tmp_path):
    manifests = rendered(path, images["tools"])
    sets = serving_sets(manifests)
    assert sets
    probed: set[str] = set()  # the sidecars of a role's instances differ only in names: one runs
    for sts in sets:
        pod_spec = sts["spec"]["template"]["spec"]
        init, report = pod_spec["initContainers"]
        engine, sidecar = pod_spec["containers"]
        role = sts["metadata"]["labels"]["pd.serving.dev/role"]
        claimed = json.loads(config_map_data(manifests)[f"preflight-{role}.json"])["image"]
        assert init["image"] == images["tools"] and engine["image"] == sidecar["image"]
        image = local_image(images, manifests, engine["image"])
        rendered_argv = engine["command"][engine["command"].index("--") + 1:]
        for ordinal in range(sts["spec"]["replicas"]):
            name = f"{sts['metadata']['name']}-{ordinal}"
            pod = Pod(manifests, sts, ordinal, tmp_path / name)
            if sts is sets[0] and ordinal == 0:
                # Without the init step the tools directory is empty: the pod must not start.
                bare = pod.run(engine, image)
                assert bare.returncode != 0 and pod.recorded() is None, bare
                assert f"{bundle.MOUNT}/pd-preflight" in bare.stderr, bare.stderr
            done = pod.run(init, local_image(images, manifests, init["image"]))
            assert done.returncode == 0, f"{name} init: {done.stderr}"
            assert (pod.sources["pd-tools"] / "pd-preflight").is_file()
            message = pod.work / "termination-log"  # the file the kubelet mounts there and reads
            message.write_text("")
            message.chmod(0o666)
            done = pod.run(report, image, "--volume", f"{message}:{report['terminationMessagePath']}")
            assert done.returncode == 0, f"{name} report: {done.stderr}"
            found = read_report(message.read_text())
            seed = "seed change" if claimed.get("seedChange") else "no seed change"
            assert found is not None and found.startswith(claimed["vllmAscendVersion"]), found
            assert found.endswith(f", {seed}"), found
            done = pod.run(engine, image)
            assert done.returncode == 0, f"{name}: the preflight refused:\n{done.stderr}"
            argv = pod.recorded()
            assert argv is not None, done.stderr
            assert [Path(argv[0]).name, *argv[1:]] == [*rendered_argv, *per_pod_flags(
                rendered_argv, sts["spec"]["replicas"], ordinal)]
            if sidecar["name"] not in probed:
                probed.add(sidecar["name"])
                probe_reaches_its_loop(pod, sidecar, image, tmp_path / f"{name}-probe.log")


def http_status(box: containers.Container, path: str) -> int | None:
    """The status of GET http://127.0.0.1:PROBE_PORT/path from inside the container (None: no answer)."""
    script = ("import sys, urllib.request, urllib.error\n"
              f"try: print(urllib.request.urlopen('http://127.0.0.1:{PROBE_PORT}{path}', timeout=5).status)\n"
              "except urllib.error.HTTPError as e: print(e.code)\n"
              "except OSError: print('none')\n")
    done = containers.podman("exec", box.container, "python3", "-c", script, check=False)
    word = done.stdout.strip()
    return int(word) if word.isdigit() else None


def probe_reaches_its_loop(pod: Pod, sidecar: dict, image: str, log: Path) -> None:
    options, args = pod.options(sidecar, "--network", "none")
    with containers.Container(image, args, options=options, log=log, name="pd-kv-probe") as box:
        if sidecar["command"][2] == "serve":
            # Its engine is open and its test KV registered: the descriptor is published.
            wait_for("the probe's descriptor", lambda: http_status(box, "/descriptor") == 200,
                     PROBE_START_S, alive=[box])
            assert '"serving"' in box.logs()
        else:
            # A round ran (no peer links: their names do not resolve here) and the gate answers.
            wait_for("a gate round", lambda: '"ok"' in box.logs(), PROBE_START_S, alive=[box])
            assert http_status(box, PROBE_READY_PATH) == 503
            assert http_status(box, "/link") is not None
        assert "Traceback" not in box.logs()


@pytest.mark.parametrize("path", VALID_EXAMPLES[:1], ids=lambda p: p.stem)
def test_the_proxy_serves_a_request_in_the_operator_image(path, images, tmp_path):
    manifests = rendered(path, images["tools"])
    (deployment,) = [d for d in of_kind(manifests, "Deployment")]
    pod_spec = deployment["spec"]["template"]["spec"]
    proxy = container(deployment)
    assert proxy["image"] == images["tools"]
    membership = tmp_path / "membership"
    membership.mkdir()
    membership.chmod(0o755)
    port, admin, metrics = (pick_port(HOST) for _ in range(3))  # the host's network: free ports
    # The members are fake engines on loopback, not the rendered instances' addresses the rendered
    # --deployment/--namespace/--serving-port would hold them to (tests/security covers that rule).
    command = proxy["command"]
    flags = ("--deployment", "--namespace", "--serving-port")
    identity = {i for i, word in enumerate(command) if word in flags}
    command = [w for i, w in enumerate(command) if i not in identity and i - 1 not in identity]
    cont = {**proxy, "command": [*command, "--host", HOST, "--port", str(port), "--admin-port", str(admin),
                                 "--metrics-port", str(metrics)]}
    options = [*containers.security_options(pod_spec, cont),
               *containers.volume_options(pod_spec, cont, {"membership": membership}),
               *containers.command_options(cont)[0], "--network", "host"]
    name = containers.container_name("pd-proxy")
    argv = containers.run_argv(images["tools"], options=options, name=name)

    async def serve() -> None:
        prefill, decode = await started(FakeEngine("p0", "prefill"), FakeEngine("d0", "decode"))
        swap(membership / KEY, document([prefill.upstream], [decode.upstream]))
        (membership / KEY).chmod(0o644)
        try:
            async with ProxyProcess(argv, HOST, port, tmp_path / "proxy.log", admin,
                                    env=containers.environment(), metrics_port=metrics) as served:
                status, body = await served.post("/v1/completions", {
                    "model": "m", "prompt": "hello", "max_tokens": 4})
                assert status == 200, body
                assert body["choices"][0]["text"]
                assert [r.request_id for r in prefill.received] == [r.request_id for r in decode.received]
                assert not prefill.errors and not decode.errors
            # It was the container that served: its process logged the membership it read.
            assert "p0" in (tmp_path / "proxy.log").read_text()
        finally:
            await asyncio.gather(prefill.stop(), decode.stop())
            containers.remove(name)

    asyncio.run(serve())

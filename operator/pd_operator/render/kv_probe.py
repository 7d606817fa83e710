"""The KV-link probe sidecars (pd_operator.transfer.probe), one in every serving pod.

Prefill pods run `pd-kv-probe serve`: a test KV buffer laid out with this pairing's real engine
block sizes, published on ports.PROBE_PORT. Decode pods run `pd-kv-probe gate`: every
GATE_PERIOD seconds it pulls that buffer from every prefill instance the proxy routes to and
verifies every byte; its `/ready` answers 200 only while the last round linked each of them. The
sidecar's readinessProbe reads it, so a decode pod is not Ready, and the operator does not route to
its instance, until its KV link works (controller/links.py). Both sides take the pairing from the
mounted revision config (`--config`, render/serving_config.py), so every model description gets a
probe. It moves host memory over tcp with P2P handshakes: the NPU transport is exercised by the engine itself.

Why the proxy's prefill members rather than every prefill instance of the spec: a prefill instance
a scale-up adds takes minutes to load; were it a peer at once, every decode gate would fail its
next round and every decode instance would leave the proxy until the new prefill served. The gate
reads the proxy's membership ConfigMap (render/proxy.py), which lists a prefill instance once all
its pods are Ready, so a decode instance links exactly the prefill instances it can be paired with:
those on its own KV layout (`--layout`; a rollout that changes the layout lists both for a while).
Without the proxy (spec.proxy.enabled false) the gate links every prefill instance of the spec, as the
peers ConfigMap lists them (render/serving_config.py).

The mounted file follows the ConfigMap up to about a minute late, so the operator also pushes each
membership to the gate's probe port and reads back what it applied (transfer/gate_state.py): the port
the NetworkPolicy admits the operator's namespace to (render/policy.py). The gate reports unready only
after gate_state.FAILURE_THRESHOLD failed rounds in a row, so the readinessProbe takes its answer at
once (failureThreshold 1).
"""

from __future__ import annotations

from pd_operator.proxy.membership import KEY, MOUNT_DIR
from pd_operator.render import proxy, security, serving_config, tools
from pd_operator.serving_image import bundle
from pd_operator.spec.ports import HANDSHAKE_RPC, PROBE_PORT, PROBE_READY_PATH
from pd_operator.spec.validate import Resolved

PROBE = "pd-kv-probe"  # run from the tools bundle (render/tools.py) by the serving image's python3
CONTAINER = {"prefill": "kv-probe", "decode": "kv-link"}
PORT_NAME = "kv-probe"
GATE_PERIOD = 30


def _gated_by_membership(ctx: Resolved, role: str) -> bool:
    return role == "decode" and ctx.deployment.spec.proxy.enabled


def _peers(ctx: Resolved, role: str) -> tuple[dict, dict] | None:
    """(volume, mount) of what a decode gate learns its prefill peers from: the proxy's membership,
    else the peers ConfigMap (render/serving_config.py). Neither is part of a revision: both change
    in place as prefill scales."""
    if role != "decode":
        return None
    if _gated_by_membership(ctx, role):
        return proxy.membership_volume(ctx)
    return serving_config.peers_volume(ctx)


def probe_argv(ctx: Resolved, role: str) -> list[str]:
    common = ["--config", serving_config.PAIRING_PATH, "--port", str(PROBE_PORT)]
    if role == "prefill":
        return [*bundle.command(PROBE), "serve", *common]
    members = (["--membership", f"{MOUNT_DIR}/{KEY}"] if _gated_by_membership(ctx, role)
               else ["--peers-config", serving_config.PEERS_PATH])
    # --layout also without the proxy: the operator pushes the membership to every gate.
    return [*bundle.command(PROBE), "gate", *common, *members, "--layout", ctx.layout_hash,
            "--every", str(GATE_PERIOD)]


def volumes(ctx: Resolved, role: str) -> list[dict]:
    """Pod volumes the sidecar needs besides the revision config (the pod mounts that anyway)."""
    return [peers[0]] if (peers := _peers(ctx, role)) else []


def readiness(role: str) -> dict:
    if role == "prefill":
        return {"tcpSocket": {"port": PORT_NAME}, "periodSeconds": 10}
    # The gate's verdict already counts failed rounds (gate_state.FAILURE_THRESHOLD).
    return {"httpGet": {"path": PROBE_READY_PATH, "port": PORT_NAME}, "periodSeconds": 10,
            "failureThreshold": 1}


def sidecar(ctx: Resolved, role: str, config: str) -> dict:
    """`config`: the name of the role's revision config (render/serving_config.py)."""
    spec = ctx.deployment.spec
    peers = _peers(ctx, role)
    return {
        "name": CONTAINER[role],
        "image": spec.image.name,
        "imagePullPolicy": ctx.serving_pull_policy(),
        "command": probe_argv(ctx, role),
        # The probe names its engine after POD_IP; its Mooncake RPC ports stay in the planned range.
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "MC_MIN_RPC_PORT", "value": str(HANDSHAKE_RPC[0])},
                {"name": "MC_MAX_RPC_PORT", "value": str(HANDSHAKE_RPC[1])}],
        "ports": [{"name": PORT_NAME, "containerPort": PROBE_PORT, "protocol": "TCP"}],
        "volumeMounts": [serving_config.volume(config)[1], tools.mount(), *([peers[1]] if peers else [])],
        "readinessProbe": readiness(role),
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
        "securityContext": dict(security.SIDECAR),
    }

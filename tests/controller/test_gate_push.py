"""The reconcile and the decode gates (issue 32): it pushes the membership it writes to every running
decode pod's gate, holds a removed prefill instance while any gate still links it, and deletes it once
every gate reports a membership without it. On the real reconcile with an in-memory API client and a
dialer standing in for the pods' ports (the protocol itself: tests/transfer/test_gate_protocol.py)."""

from __future__ import annotations

import yaml

from pd_operator.controller import reconcile as reconcile_mod
from pd_operator.controller.proxy_state import ProxyUnreachable
from pd_operator.proxy.membership import ProxyState, parse_document
from pd_operator.transfer.gate_state import GateState
from support.controller_fakes import MemoryClient, pods_of, with_status
from support.specs import EXAMPLES

UID = "0b1c2d3e-0000-4000-8000-000000000032"
P1 = "glm-flash-prefill-1"


class Client(MemoryClient):
    """The API as the reconcile uses it on a deployment that already runs: its PDRoles' counts are
    forwarded and what it prunes or drains is recorded."""

    def forward_replicas(self, namespace: str, name: str, patch: dict) -> dict:
        self.writes.append(("forward", name))
        return {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDRole",
                "metadata": {"name": name, "namespace": namespace, **patch.get("metadata", {})},
                "spec": patch.get("spec", {})}

    def delete(self, obj: dict) -> None:
        self.writes.append(("delete", f"{obj['kind']}/{obj['metadata']['name']}"))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete", f"Pod/{name}"))


class Dialer:
    """Proxies that let every removed instance go; gates that report `behind` (a membership still
    listing prefill 1) or what was pushed."""

    def __init__(self, behind: bool) -> None:
        self.behind = behind
        self.pushed: list[tuple[list[str], dict]] = []

    def read_all(self, pods: dict, token: str | None = None) -> dict:
        return {name: ProxyState("v", {}) for name in pods}

    def push_all(self, pods: dict, document: dict) -> dict:
        self.pushed.append((sorted(pods), document))
        members = [u.name for u in parse_document(document).prefill]
        if self.behind:
            return {name: GateState("old", ("glm-flash-prefill-0", P1), True, 0, None) for name in pods}
        return {name: GateState(document["version"], tuple(members), True, 0, None) for name in pods}

    def gate(self, pod_ip: str, port: int = 0) -> GateState:
        raise ProxyUnreachable("connection refused", refused=True)


def _body(prefill: int) -> dict:
    doc = yaml.safe_load((EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml").read_text())
    doc["metadata"] |= {"namespace": "default", "uid": UID, "generation": 1}
    doc["spec"]["prefill"]["replicas"] = prefill
    return doc


def _running(applied: list[dict]) -> list[dict]:
    pods = pods_of(with_status(applied))
    for i, pod in enumerate(pods):
        pod["status"]["podIP"] = f"10.0.0.{i + 1}"
    return pods


def test_a_removed_prefill_goes_only_once_every_gate_has_the_membership_without_it():
    first = Client()
    reconcile_mod.reconcile(first, Dialer(behind=False), _body(2), [], [])  # type: ignore[arg-type]
    applied = [m for verb, m in first.writes if verb in ("apply", "create")]
    pods = _running(applied)
    decode_pods = sorted(p["metadata"]["name"] for p in pods if "-decode-" in p["metadata"]["name"])

    # the pods run: the membership changes (every instance now routable), so the gates are told
    dialer = Dialer(behind=False)
    reconcile_mod.reconcile(Client(), dialer, _body(2), applied, pods)  # type: ignore[arg-type]
    ((told, document),) = dialer.pushed
    assert told == decode_pods
    assert [u.name for u in parse_document(document).prefill] == ["glm-flash-prefill-0", P1]

    # prefill scaled to 1: a gate still linking prefill 1 holds its drain, whatever the proxies say
    body = _body(1)
    held, dialer = Client(), Dialer(behind=True)
    reconcile_mod.reconcile(held, dialer, body, applied, pods)  # type: ignore[arg-type]
    ((_, document),) = dialer.pushed
    assert [u.name for u in parse_document(document).prefill] == ["glm-flash-prefill-0"]
    assert not any(verb == "delete" and P1 in what for verb, what in held.writes)
    (status,) = [s for verb, s in held.writes if verb == "status"]
    (draining,) = status["draining"]
    assert draining["name"] == P1 and "KV-link gate links it (membership old)" in draining["waitingFor"]

    # every gate reports the membership without it: its objects go
    gone = Client()
    reconcile_mod.reconcile(gone, Dialer(behind=False), body, applied, pods)  # type: ignore[arg-type]
    deleted = {what for verb, what in gone.writes if verb == "delete"}
    assert f"StatefulSet/{P1}" in deleted


def test_a_steady_deployment_dials_no_gate():
    first = Client()
    reconcile_mod.reconcile(first, Dialer(behind=False), _body(2), [], [])  # type: ignore[arg-type]
    applied = [m for verb, m in first.writes if verb in ("apply", "create")]
    pods = _running(applied)
    second = Client()
    reconcile_mod.reconcile(second, Dialer(behind=False), _body(2), applied, pods)  # type: ignore[arg-type]
    now = [m for verb, m in second.writes if verb == "apply"]
    observed = {(m["kind"], m["metadata"]["name"]): m for m in applied}
    observed |= {(m["kind"], m["metadata"]["name"]): m for m in now}
    dialer = Dialer(behind=False)
    reconcile_mod.reconcile(Client(), dialer, _body(2), list(observed.values()), pods)  # type: ignore[arg-type]
    assert dialer.pushed == []

"""The validator as pdctl, the webhook and the controller call it: spec/validate.py's rules, then,
last, the check that every container the renderer would run can run in the image it names
(serving_image/contents.py; finding ImageCannotRun): a spec whose pods would not start is not
servable. It lives above the renderer because it checks what the renderer produces.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from pd_operator.api.types import ROLES
from pd_operator.findings import Finding
from pd_operator.render import proxy, workloads
from pd_operator.render.workloads import Templates
from pd_operator.serving_image import contents
from pd_operator.spec import node_access
from pd_operator.spec import validate as spec_validate
from pd_operator.spec.host_paths import WEIGHTS_ROOT, HostPathPolicy
from pd_operator.spec.validate import Resolved, Validation


def add_flags(command: argparse.ArgumentParser) -> None:
    """The validator's settings as command-line flags, one spelling for the operator (`run`) and for
    pdctl (`validate`, `render`), so pdctl answers as the operator would with the same values."""
    command.add_argument("--allow-host-path", action="append", default=[], metavar="PATH",
                         help="a node path (and what lies under it) PDDeployments may mount (repeatable); "
                              "{namespace} in it stands for the PDDeployment's namespace "
                              "(/data/{namespace}); "
                              "default: the Ascend driver and tool paths of the node presets and "
                              f"{WEIGHTS_ROOT}")
    command.add_argument(node_access.HOST_NETWORK_FLAG, action="store_true",
                         help="let PDDeployments use the host network (spec/node_access.py says what it "
                              "gives)")
    command.add_argument(node_access.TOLERATIONS_FLAG, action="store_true",
                         help="let PDDeployments tolerate the control plane's taints, or every taint")
    command.add_argument(node_access.HOST_PATH_CREATION_FLAG, action="store_true",
                         help="let PDDeployments mount host paths of type DirectoryOrCreate, FileOrCreate "
                              "or \"\"")
    command.add_argument(node_access.ALWAYS_PULL_FLAG, action="store_true",
                         help="every rendered container pulls its image (imagePullPolicy Always), so no pod "
                              "runs an image a node cached for another tenant without that image's pull "
                              "secret")
    command.add_argument(contents.TOOLS_IMAGE_FLAG, default=contents.DEFAULT_TOOLS_IMAGE, metavar="IMAGE",
                         help="the operator's own image: serving pods copy the tools bundle from it and "
                              "the proxy runs from it (the chart passes its image; default "
                              f"{contents.DEFAULT_TOOLS_IMAGE})")


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """`validate`'s options from flags `add_flags` declared; ValueError naming the flag."""
    try:
        policy = HostPathPolicy.of(args.allow_host_path)
    except ValueError as err:
        raise ValueError(f"--allow-host-path: {err}") from None
    access = node_access.NodeAccess(host_network=args.allow_host_network,
                                    control_plane_tolerations=args.allow_control_plane_tolerations,
                                    host_path_creation=args.allow_host_path_creation,
                                    always_pull_images=args.always_pull_images)
    return {"host_path_policy": policy, "tools_image": args.tools_image, "node_access": access}


@dataclass(frozen=True)
class Checked:
    validation: Validation
    templates: Templates | None = None
    """When the spec is servable: each role's pod template and revision as the run check rendered
    them, for the caller to render and gate with (render/workloads.py)."""


def check(doc: Any, **options: Any) -> Checked:
    """spec/validate.py's rules (same options), then the run check on what they resolved."""
    result = spec_validate.spec_rules_only(doc, **options)
    if result.resolved is None:
        return Checked(result)
    rendered = workloads.templates(result.resolved)
    if cannot_run := run_findings(result.resolved, rendered):
        return Checked(dataclasses.replace(result, findings=[*result.findings, *cannot_run], resolved=None))
    return Checked(result, rendered)


def validate(doc: Any, **options: Any) -> Validation:
    """`check`'s validation, for callers that render nothing (the webhook, `pdctl validate`)."""
    return check(doc, **options).validation


def run_findings(resolved: Resolved, rendered: Templates) -> list[Finding]:
    """ImageCannotRun for every rendered container whose image cannot run its command: the pods of one
    instance per role (every instance of a role runs the same commands; one is rendered even for a
    role at 0 instances, which a scale-up would start) and the proxy's."""
    image = resolved.deployment.spec.image

    def contents_of(name: str) -> contents.Contents | None:
        return contents.of_image(name, tools_image=resolved.tools_image, serving_name=image.name,
                                 serving_version=image.vllm_ascend_version, serving_ours=image.seed_change)

    def field_of(name: str) -> str:
        if name == resolved.deployment.spec.proxy.image:
            return "spec.proxy.image"
        return "spec.image.name" if name == image.name else f"pd-operator {contents.TOOLS_IMAGE_FLAG}"

    pods = [workloads.stateful_set(resolved, role, 0, rendered) for role in ROLES]
    if resolved.deployment.spec.proxy.enabled:
        pods.append(proxy.deployment(resolved))
    return contents.findings(pods, contents_of, field_of)

"""How one role instance (one vLLM engine of TP x DP x PP NPUs) is split into pods.

An instance that fits one node is one pod running all its DP ranks. A larger one uses vLLM's
external data parallel: each pod runs `dp_local` DP ranks (`--data-parallel-size-local`,
`--data-parallel-start-rank`), pod 0 is the leader that serves HTTP and the others run
`--headless` (vllm-project/vllm: vllm/engine/arg_utils.py and vllm/entrypoints/cli/serve.py
@ v0.34.0). Tensor and pipeline parallel stay inside a pod.
"""

from __future__ import annotations

from dataclasses import dataclass

from pd_operator.api.types import RoleSpec


class TopologyError(ValueError):
    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class InstanceShape:
    pods: int
    dp_local: int
    """DP ranks each pod runs."""
    npus_per_pod: int
    tp: int
    dp: int
    pp: int

    def start_rank(self, ordinal: int) -> int:
        return ordinal * self.dp_local

    @property
    def multi_pod(self) -> bool:
        return self.pods > 1


def instance_shape(role: RoleSpec, path: str) -> InstanceShape:
    tp, dp, pp = role.tensor_parallel_size, role.data_parallel_size, role.pipeline_parallel_size
    per_rank = tp * pp
    node = role.npus_per_node
    if per_rank * dp <= node:
        return InstanceShape(1, dp, per_rank * dp, tp, dp, pp)
    if per_rank > node:
        raise TopologyError(
            f"One DP rank needs TP {tp} x PP {pp} = {per_rank} NPUs but a node has {node} "
            f"(npusPerNode); tensor and pipeline parallel must fit one node, so lower "
            f"tensorParallelSize or raise npusPerNode.", f"{path}.tensorParallelSize")
    dp_local = node // per_rank
    if dp % dp_local:
        raise TopologyError(
            f"{dp} DP ranks do not split evenly into pods of {dp_local} ranks ({node} NPUs per node "
            f"/ {per_rank} per rank); use a dataParallelSize that is a multiple of {dp_local}.",
            f"{path}.dataParallelSize")
    return InstanceShape(dp // dp_local, dp_local, dp_local * per_rank, tp, dp, pp)

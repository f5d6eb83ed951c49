"""What each torch worker's environment should be: pure functions, decided on the driver.

Everything here is plain data in, plain data out, so the rules (torchrun's variables, the CPU
share per worker, which GPUs a worker sees) are tested without processes or GPUs.
:mod:`phalanx.torch._worker_setup` applies the results inside the workers. Which of its GPUs is
a worker's device is :mod:`phalanx._internal.devices`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

__all__ = [
    "LOOPBACK_ADDRESS",
    "cpu_share",
    "loopback_interface",
    "master_address",
    "shared_visible_devices",
    "torchrun_env",
]

LOOPBACK_ADDRESS = "127.0.0.1"
_IFF_LOOPBACK = 0x8


def torchrun_env(
    *,
    world_rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    node_rank: int,
    num_nodes: int,
) -> dict[str, str]:
    """The variables torchrun gives each worker (``MASTER_*`` are added once the port is known).

    ``NODE_RANK`` is Ray Train's name for torchrun's ``GROUP_RANK``; both are set.
    """
    return {
        "RANK": str(world_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(num_nodes),
        "NODE_RANK": str(node_rank),
    }


def cpu_share(
    resources_per_worker: Mapping[str, float] | None, cpu_count: int, local_world_size: int
) -> int:
    """Threads a worker should use: its ``CPU`` resource if given, else an equal share of the
    node's cores (never below 1). Without this, every worker starts one thread per core and
    ``local_world_size`` workers fight over the same cores."""
    cpus = (resources_per_worker or {}).get("CPU")
    if cpus:
        return max(1, int(cpus))
    return max(1, cpu_count // max(1, local_world_size))


def master_address(node_ids: Sequence[str], rank0_host: str) -> str:
    """Where rank 0's store listens: loopback when every worker is on one node (nothing is
    exposed to the network), else rank 0's host."""
    return LOOPBACK_ADDRESS if len(set(node_ids)) <= 1 else rank0_host


def shared_visible_devices(node_ids: Sequence[str], gpu_ids: Sequence[Sequence[int]]) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each worker: the union of the GPU ids of every worker on its
    node, sorted (NCCL needs peers on the node visible for peer-to-peer transfers).

    >>> shared_visible_devices(["a", "a", "b"], [(0, 1), (2, 3), (0, 1)])
    ['0,1,2,3', '0,1,2,3', '0,1']
    """
    per_node: dict[str, set[int]] = {}
    for node, ids in zip(node_ids, gpu_ids, strict=True):
        per_node.setdefault(node, set()).update(ids)
    return [",".join(str(i) for i in sorted(per_node[node])) for node in node_ids]


def gpus_shared_by_ranks(
    node_ids: Sequence[str], gpu_ids: Sequence[Sequence[int]]
) -> dict[tuple[str, int], list[int]]:
    """Each GPU that more than one rank was given, as ``(node, gpu id) -> ranks``. NCCL refuses
    two ranks on one device ("Duplicate GPU detected"), deep inside the first collective.

    >>> gpus_shared_by_ranks(["a", "a", "b"], [(0,), (0,), (0,)])
    {('a', 0): [0, 1]}
    """
    owners: dict[tuple[str, int], list[int]] = {}
    for rank, (node, ids) in enumerate(zip(node_ids, gpu_ids, strict=True)):
        for gpu in ids:
            owners.setdefault((node, gpu), []).append(rank)
    return {key: ranks for key, ranks in owners.items() if len(ranks) > 1}


def loopback_interface(sys_class_net: str = "/sys/class/net") -> str:
    """The name of the loopback network interface (``lo`` on Linux), for ``GLOO_SOCKET_IFNAME``."""
    try:
        names = sorted(os.listdir(sys_class_net))
    except OSError:
        return "lo"
    for name in names:
        try:
            with open(os.path.join(sys_class_net, name, "flags")) as f:
                if int(f.read().strip(), 16) & _IFF_LOOPBACK:
                    return name
        except (OSError, ValueError):
            continue
    return "lo"

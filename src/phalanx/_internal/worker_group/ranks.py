"""Rank assignment, as torchrun does it: workers grouped by node, nodes in order of appearance."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx._internal.engines.base import WorkerMetadata


@dataclass(frozen=True)
class RankInfo:
    world_rank: int
    local_rank: int
    node_rank: int
    local_world_size: int


def assign_ranks(metadata: list[WorkerMetadata]) -> list[RankInfo]:
    """Return each worker's ranks, indexed like ``metadata`` (launch order).

    Workers on the same node get consecutive world ranks; the node of the first-launched worker is
    node 0, so rank 0 stays where it was asked to be.
    """
    nodes: dict[str, list[int]] = {}
    for index, meta in enumerate(metadata):
        nodes.setdefault(meta.node_id, []).append(index)
    ranks: list[RankInfo | None] = [None] * len(metadata)
    world_rank = 0
    for node_rank, members in enumerate(nodes.values()):
        for local_rank, index in enumerate(members):
            ranks[index] = RankInfo(world_rank, local_rank, node_rank, len(members))
            world_rank += 1
    return [r for r in ranks if r is not None]

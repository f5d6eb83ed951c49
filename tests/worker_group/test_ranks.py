"""Rank assignment: workers grouped by node as torchrun numbers them."""

from __future__ import annotations

from phalanx._internal.engines.base import WorkerMetadata
from phalanx._internal.worker_group.ranks import assign_ranks


def meta(node):
    return WorkerMetadata(host=node, node_id=node, pid=None)


def test_ranks_group_workers_by_node_like_torchrun():
    ranks = assign_ranks([meta("a"), meta("b"), meta("a"), meta("b"), meta("c")])
    assert [(r.world_rank, r.node_rank, r.local_rank, r.local_world_size) for r in ranks] == [
        (0, 0, 0, 2),
        (2, 1, 0, 2),
        (1, 0, 1, 2),
        (3, 1, 1, 2),
        (4, 2, 0, 1),
    ]

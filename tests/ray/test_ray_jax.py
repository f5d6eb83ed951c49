"""JaxTrainer on Ray actors placed on two (fake) nodes: the coordinator listens on rank 0's host,
not on loopback, and psum spans both actors."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("jax")

import phalanx as train
from phalanx import RunConfig, ScalingConfig

pytestmark = pytest.mark.slow


def psum_on_every_node():
    import jax
    import ray
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    rank = train.get_context().get_world_rank()
    mesh = Mesh(np.array(jax.devices()), ("w",))
    glob = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("w")), np.full((1,), float(rank + 1), np.float32)
    )
    psum = jax.shard_map(lambda t: jax.lax.psum(t, "w"), mesh=mesh, in_specs=P("w"), out_specs=P())
    train.report(
        {
            "node_id": ray.get_runtime_context().get_node_id(),
            "count": jax.process_count(),
            "index": jax.process_index(),
            "psum": float(np.asarray(jax.jit(psum)(glob).addressable_data(0))[0]),
        }
    )


def test_jax_distributed_across_two_ray_nodes(cluster, storage):
    from phalanx.jax import JaxTrainer

    _, worker_nodes = cluster
    result = JaxTrainer(
        psum_on_every_node,
        scaling_config=ScalingConfig(
            num_workers=2,
            resources_per_worker={"CPU": 1, "trainer": 1},
            placement_strategy="SPREAD",
        ),
        run_config=RunConfig(name="jax", storage_path=storage),
    ).fit()
    ranks = result.all_ranks_metrics_dataframe.sort_values("rank")
    assert sorted(ranks["node_id"]) == sorted(worker_nodes)  # one actor per node
    assert list(ranks["index"]) == [0, 1]
    assert list(ranks["count"]) == [2, 2]
    assert list(ranks["psum"]) == [3.0, 3.0]

"""The Ray engine across nodes: a fake cluster on this machine (``ray.cluster_utils.Cluster``).

The head node has no ``trainer`` resource, so workers that ask for it land on the two worker
nodes only; each worker node is a separate raylet with its own node id.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import threading
import time

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import ConfigError, DataParallelTrainer, RunConfig, ScalingConfig, TrainingFailedError

pytestmark = pytest.mark.slow


def fit(fn, storage, scaling, config=None, name="run"):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=RunConfig(name=name, storage_path=storage),
    ).fit()


def where_am_i():
    import ray

    ctx = train.get_context()
    train.report(
        {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_rank": ctx.get_node_rank(),
            "local_rank": ctx.get_local_rank(),
            "local_world_size": ctx.get_local_world_size(),
        }
    )


def placements(result):
    ranks = result.all_ranks_metrics_dataframe.sort_values("rank")
    return [tuple(row[1:]) for row in ranks[["rank", *ranks.columns[-4:]]].itertuples()]


def test_spread_puts_workers_on_different_nodes_with_torchrun_ranks(cluster, storage):
    _, worker_nodes = cluster
    scaling = ScalingConfig(
        num_workers=2,
        resources_per_worker={"CPU": 1, "trainer": 1},
        placement_strategy="SPREAD",
    )
    ranks = fit(where_am_i, storage, scaling).all_ranks_metrics_dataframe.sort_values("rank")
    assert sorted(ranks["node_id"]) == sorted(worker_nodes)
    assert list(ranks["node_rank"]) == [0, 1]
    assert list(ranks["local_rank"]) == [0, 0]
    assert list(ranks["local_world_size"]) == [1, 1]


def test_pack_groups_ranks_by_node_like_torchrun(cluster, storage):
    scaling = ScalingConfig(num_workers=4, resources_per_worker={"CPU": 0.5, "trainer": 1})
    ranks = fit(where_am_i, storage, scaling).all_ranks_metrics_dataframe.sort_values("rank")
    # Two workers per node: consecutive world ranks share a node, as torchrun numbers them.
    assert len(set(ranks["node_id"])) == 2
    assert ranks["node_id"].iloc[0] == ranks["node_id"].iloc[1] != ranks["node_id"].iloc[2]
    assert list(ranks["node_rank"]) == [0, 0, 1, 1]
    assert list(ranks["local_rank"]) == [0, 1, 0, 1]
    assert list(ranks["local_world_size"]) == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("scaling", "match"),
    [
        (
            ScalingConfig(num_workers=3, resources_per_worker={"trainer": 2}),
            "3 workers need {trainer=6} in total; the cluster has {trainer=4}",
        ),
        (
            ScalingConfig(
                num_workers=3, resources_per_worker={"trainer": 1}, placement_strategy="STRICT_PACK"
            ),
            "STRICT_PACK needs one node with {trainer=3}",
        ),
        (
            ScalingConfig(
                num_workers=4, resources_per_worker={"CPU": 1}, placement_strategy="STRICT_SPREAD"
            ),
            "STRICT_SPREAD needs 4 nodes that can each hold {CPU=1}; the cluster has 3",
        ),
        (
            ScalingConfig(num_workers=1, resources_per_worker={"trainer": 1, "CPU": 3}),
            "no node can hold one worker's {CPU=3, trainer=1}",
        ),
    ],
)
def test_a_request_the_cluster_can_never_satisfy_fails_at_once(cluster, storage, scaling, match):
    start = time.monotonic()
    with pytest.raises(ConfigError, match="can never be placed on this Ray cluster") as info:
        fit(where_am_i, storage, scaling)
    assert match in str(info.value)
    assert time.monotonic() - start < 5.0  # not after the workers' start timeout


def test_a_node_removed_mid_run_fails_the_attempt_naming_node_and_rank(cluster, storage, tmp_path):
    ray_cluster, _ = cluster
    doomed = ray_cluster.add_node(num_cpus=1, resources={"spot": 1})
    ray_cluster.wait_for_nodes()

    def loop(config):
        import ray

        node = ray.get_runtime_context().get_node_id()
        with open(os.path.join(config["dir"], f"{node}.rank"), "w") as f:
            f.write(str(train.get_context().get_world_rank()))
        time.sleep(120)

    scaling = ScalingConfig(
        num_workers=2, resources_per_worker={"CPU": 1, "spot": 1}, placement_strategy="SPREAD"
    )
    outcome: queue.Queue = queue.Queue()

    def run():
        try:
            outcome.put(fit(loop, storage, scaling, config={"dir": str(tmp_path)}))
        except BaseException as exc:
            outcome.put(exc)

    runner = threading.Thread(target=run)
    runner.start()
    marker = tmp_path / f"{doomed.node_id}.rank"
    deadline = time.monotonic() + 60
    while not (marker.exists() and len(list(tmp_path.glob("*.rank"))) == 2):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    doomed_rank = int(marker.read_text())
    removed = time.monotonic()
    ray_cluster.remove_node(doomed, allow_graceful=False)
    runner.join(60)
    error = outcome.get_nowait()
    assert isinstance(error, TrainingFailedError), error
    assert time.monotonic() - removed < 20
    assert list(error.worker_failures) == [doomed_rank]
    message = error.worker_failures[doomed_rank].message
    assert f"rank {doomed_rank}" in message and doomed.node_id in message
    assert doomed.node_id in str(error)


def tf_config_and_allreduce():
    import ray
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = train.get_context().get_world_rank()
    total = strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.run(lambda: tf.constant(float(rank + 1))),
        axis=None,
    )
    train.report(
        {
            "tf_config": os.environ["TF_CONFIG"],
            "ip": ray.util.get_node_ip_address(),
            "total": float(total.numpy()),
        }
    )


def test_tensorflow_workers_on_two_nodes_form_one_cluster_at_their_node_addresses(cluster, storage):
    import json

    if not all(importlib.util.find_spec(m) for m in ("tensorflow", "tf_keras")):
        pytest.skip("tf-keras is not installed")
    from phalanx.tensorflow import TensorflowTrainer

    scaling = ScalingConfig(
        num_workers=2, resources_per_worker={"CPU": 1, "trainer": 1}, placement_strategy="SPREAD"
    )
    result = TensorflowTrainer(
        tf_config_and_allreduce,
        scaling_config=scaling,
        run_config=RunConfig(name="tf_nodes", storage_path=storage),
    ).fit()
    ranks = result.all_ranks_metrics_dataframe.sort_values("rank")
    assert list(ranks["total"]) == [3.0, 3.0]  # 1 + 2: one cluster of both ranks
    workers = json.loads(ranks["tf_config"].iloc[0])["cluster"]["worker"]
    assert [w.rsplit(":", 1)[0] for w in workers] == list(ranks["ip"])

"""``DataConfig(execution_options=...)`` on Ray Data datasets: set on a copy, as Ray Train does."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import DataConfig, DataParallelTrainer, RunConfig, ScalingConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def test_options_reach_the_split_ray_dataset_and_every_row_is_read(storage, monkeypatch):
    import ray.data

    from phalanx.data import _ingest as ingest

    options = DataConfig.default_ingest_options()
    assert isinstance(options, ray.data.ExecutionOptions)  # Ray Data is in use: Ray's own
    options.resource_limits = options.resource_limits.copy(object_store_memory=64 << 20)
    options.preserve_order = True
    configured = []
    split = ingest._ray_iterators

    def spy(value, world_size, is_split, opts):
        configured.append(opts)
        return split(value, world_size, is_split, opts)

    monkeypatch.setattr(ingest, "_ray_iterators", spy)

    def loop():
        shard = train.get_dataset_shard("train")
        ids = [int(i) for b in shard.iter_batches(batch_size=25) for i in b["id"]]
        train.report({"ids": ids})

    result = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="opts", storage_path=storage),
        datasets={"train": ray.data.range(100)},
        dataset_config=DataConfig(execution_options={"train": options}),
    ).fit()
    ids = [sorted(r) for r in result.all_ranks_metrics_dataframe.sort_values("rank")["ids"]]
    assert sorted(ids[0] + ids[1]) == list(range(100))
    assert configured == [options]


def test_options_are_set_on_a_copy_of_the_dataset():
    import ray.data

    from phalanx._foundation.execution_options import (
        ExecutionOptions,
        ExecutionResources,
        as_ray_options,
    )

    mine = ExecutionOptions(
        preserve_order=True, resource_limits=ExecutionResources(object_store_memory=5 << 20)
    )
    converted = as_ray_options(mine)
    assert isinstance(converted, ray.data.ExecutionOptions)
    assert converted.preserve_order is True
    assert converted.resource_limits.object_store_memory == 5 << 20
    defaults = as_ray_options(None)  # nothing given: Ray's ingest defaults, as Ray Train
    assert (
        defaults.preserve_order
        == ray.data.DataContext.get_current().execution_options.preserve_order
    )

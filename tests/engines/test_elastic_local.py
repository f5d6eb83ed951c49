"""Elastic ``num_workers=(min, max)`` with local processes: one size, decided at fit() from this
machine's CPUs, clamped to [min, max]; below min is a ConfigError before anything starts."""

from __future__ import annotations

import os

import pytest

import phalanx as train
from phalanx import ConfigError, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx._fit.elastic_size import resolve_locally
from phalanx.data import from_items

CPUS = os.cpu_count() or 1


def report_shard():
    ctx = train.get_context()
    rows = [row["i"] for row in train.get_dataset_shard("train").iter_rows()]
    train.report({"world_size": ctx.get_world_size(), "rows": rows})


@pytest.mark.slow
def test_min_max_resolves_to_what_this_machines_cpus_hold_and_shards_follow(tmp_path):
    # Half a CPU per worker: the machine holds 2 * CPUS; max_workers caps it below that.
    high = 2 * CPUS - 1
    result = DataParallelTrainer(
        report_shard,
        scaling_config=ScalingConfig(num_workers=(1, high), resources_per_worker={"CPU": 0.5}),
        datasets={"train": from_items([{"i": i} for i in range(4 * high)])},
        run_config=RunConfig(name="elastic_local", storage_path=str(tmp_path)),
    ).fit()
    ranks = result.all_ranks_metrics_dataframe
    assert sorted(ranks["rank"]) == list(range(high))
    assert set(ranks["world_size"]) == {high}
    # The dataset is split for the size that ran: every row once, on exactly one rank.
    rows = [i for shard in ranks["rows"] for i in shard]
    assert sorted(rows) == list(range(4 * high))


def test_capacity_is_clamped_to_max_and_fixed_configs_are_untouched():
    resolved = resolve_locally(ScalingConfig(num_workers=(1, 10_000)))
    assert resolved.num_workers == CPUS and not resolved.elasticity_enabled
    assert resolve_locally(ScalingConfig(num_workers=(1, 1))).num_workers == 1
    fixed = ScalingConfig(num_workers=3)
    assert resolve_locally(fixed) is fixed


def test_below_min_is_a_config_error_at_fit_saying_why(tmp_path):
    scaling = ScalingConfig(num_workers=(CPUS + 1, CPUS + 4))
    trainer = DataParallelTrainer(
        report_shard, scaling_config=scaling, run_config=RunConfig(storage_path=str(tmp_path))
    )
    with pytest.raises(ConfigError) as info:
        trainer.fit()
    message = str(info.value)
    assert f"needs at least {CPUS + 1} local workers" in message
    assert f"this machine holds {CPUS} ({CPUS} CPU(s), 1 per worker)" in message
    assert "HINT:" in message
    assert not os.listdir(tmp_path)  # nothing was started or written

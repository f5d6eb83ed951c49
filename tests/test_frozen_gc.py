"""fit() keeps the objects the program had before it out of the collector while it runs (see
``_fit/frozen_gc.py``), and hands them back when it returns."""

from __future__ import annotations

import gc

import pytest

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig


def _freeze_seen_by_workers(config):
    import gc

    train.report({"frozen": gc.get_freeze_count(), "enabled": gc.isenabled()})
    return gc.get_freeze_count()


def _fit(tmp_path, engine: str):
    return DataParallelTrainer(
        _freeze_seen_by_workers,
        scaling_config=ScalingConfig(num_workers=1, engine=engine),
        run_config=RunConfig(storage_path=str(tmp_path)),
    ).fit()


@pytest.fixture
def gc_as_found():
    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()
    assert frozen == 0  # the suite itself never freezes


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["thread", "local"])
def test_the_objects_before_fit_are_frozen_during_it_and_handed_back(tmp_path, engine, gc_as_found):
    assert gc.get_freeze_count() == 0
    result = _fit(tmp_path, engine)
    # The training function ran with the driver's objects frozen: in the driver's own thread, or
    # in a worker forked from the fork server, which inherits the freeze (no collection there
    # writes to the pages it shares with the driver).
    assert result.metrics["frozen"] > 0 and result.metrics["enabled"] is True
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_program_that_froze_objects_itself_keeps_its_freeze(tmp_path, gc_as_found):
    gc.freeze()
    frozen = gc.get_freeze_count()
    result = _fit(tmp_path, "thread")
    # fit() neither froze more (its own objects stay collectable) nor unfroze the program's.
    # (The count can only drop a little: frozen objects whose last reference went away.)
    assert frozen * 0.9 < result.metrics["frozen"] <= frozen
    assert frozen * 0.9 < gc.get_freeze_count() <= frozen


def test_a_program_that_disabled_the_collector_keeps_it_disabled_and_unfrozen(
    tmp_path, gc_as_found
):
    gc.disable()
    result = _fit(tmp_path, "thread")
    assert result.metrics == {**result.metrics, "frozen": 0, "enabled": False}
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_a_failed_fit_hands_the_objects_back_too(tmp_path, gc_as_found):
    def fails(config):
        raise RuntimeError("boom")

    trainer = DataParallelTrainer(
        fails,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(storage_path=str(tmp_path)),
    )
    with pytest.raises(train.TrainingFailedError):
        trainer.fit()
    assert gc.get_freeze_count() == 0 and gc.isenabled()

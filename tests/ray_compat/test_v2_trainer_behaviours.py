"""Data-parallel trainer behaviours Ray's V2 tests and user guides rely on, with phalanx imports:
collectives, runtime env, fault tolerance, persistence, custom backends, callbacks, errors."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import phalanx as train
from phalanx import (
    Backend,
    BackendConfig,
    Checkpoint,
    CheckpointConfig,
    ConfigError,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from phalanx.collective import barrier, broadcast_from_rank_zero

pytestmark = pytest.mark.slow

TWO = ScalingConfig(num_workers=2)


def _save(d: str, name: str, value: object) -> Checkpoint:
    with open(os.path.join(d, name), "w") as f:
        f.write(str(value))
    return Checkpoint.from_directory(d)


def test_collectives_without_torch_distributed(storage, tmp_path):
    """ray.train.collective: rank 0 builds something once and broadcasts it; barrier() holds
    every rank until all arrived."""
    marker = tmp_path / "rank1_was_here"

    def train_func():
        rank = train.get_context().get_world_rank()
        vocab = {"built_by": rank, "words": ["a", "b"]} if rank == 0 else None
        vocab = broadcast_from_rank_zero(vocab)
        if rank == 1:
            time.sleep(0.3)  # arrive late: rank 0 must still wait for it
            marker.write_text("1")
        barrier()
        seen = marker.exists()
        barrier()
        train.report({"vocab_from": vocab["built_by"], "saw_rank1": seen})
        return [broadcast_from_rank_zero(i * (rank + 1)) for i in range(3)]

    result = DataParallelTrainer(
        train_func, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
    ).fit()
    assert result.metrics == {"vocab_from": 0, "saw_rank1": True}
    assert result.return_value == [0, 1, 2]
    ranks = result.all_ranks_metrics_dataframe
    assert set(ranks["vocab_from"]) == {0} and set(ranks["saw_rank1"]) == {True}


def test_worker_runtime_env_env_vars_and_working_dir_on_local_workers(storage, tmp_path):
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "settings.txt").write_text("from the working dir")

    def train_func():
        train.report(
            {"flag": os.environ.get("MY_FLAG"), "settings": Path("settings.txt").read_text()}
        )

    result = DataParallelTrainer(
        train_func,
        scaling_config=TWO,
        run_config=RunConfig(
            storage_path=storage,
            worker_runtime_env={"env_vars": {"MY_FLAG": "on"}, "working_dir": str(workdir)},
        ),
    ).fit()
    assert result.metrics == {"flag": "on", "settings": "from the working dir"}
    assert "MY_FLAG" not in os.environ


def test_worker_runtime_env_that_local_workers_cannot_honour(storage):
    trainer = DataParallelTrainer(
        lambda: None,
        run_config=RunConfig(storage_path=storage, worker_runtime_env={"pip": ["requests"]}),
    )
    with pytest.raises(ConfigError, match="pip"):
        trainer.fit()


def test_fault_tolerance_resumes_from_the_latest_checkpoint(storage, tmp_path):
    """Fault tolerance guide: FailureConfig(max_failures=...), get_checkpoint() after a retry."""
    crashed = tmp_path / "crashed"

    def train_func(config):
        start = 0
        checkpoint = train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                start = int(Path(os.path.join(d, "epoch")).read_text()) + 1
        for epoch in range(start, config["epochs"]):
            with tempfile.TemporaryDirectory() as d:
                train.report({"epoch": epoch, "start": start}, checkpoint=_save(d, "epoch", epoch))
            if epoch == 2 and train.get_context().get_world_rank() == 1 and not crashed.exists():
                crashed.write_text("1")
                os._exit(1)  # the worker dies, as on a lost node

    result = DataParallelTrainer(
        train_func,
        train_loop_config={"epochs": 5},
        scaling_config=TWO,
        run_config=RunConfig(storage_path=storage, failure_config=FailureConfig(max_failures=1)),
    ).fit()
    assert result.metrics == {"epoch": 4, "start": 3}


def test_rerun_with_the_same_name_resumes(storage):
    """Persistence guide: running the script again with the same storage_path and name picks
    up the run's latest checkpoint."""

    def train_func(config):
        start = 0
        if train.get_checkpoint():
            with train.get_checkpoint().as_directory() as d:
                start = int(Path(os.path.join(d, "epoch")).read_text()) + 1
        for epoch in range(start, start + config["epochs"]):
            with tempfile.TemporaryDirectory() as d:
                train.report({"epoch": epoch}, checkpoint=_save(d, "epoch", epoch))

    run_config = RunConfig(storage_path=storage, name="same_name")
    for expected in (1, 3):
        result = DataParallelTrainer(
            train_func, train_loop_config={"epochs": 2}, run_config=run_config
        ).fit()
        assert result.metrics == {"epoch": expected}


def test_only_a_non_zero_rank_saves_the_checkpoint(storage):
    """Checkpoints guide: any rank may save; the round's checkpoint holds that rank's files and
    rank 0's metrics."""

    def train_func():
        rank = train.get_context().get_world_rank()
        with tempfile.TemporaryDirectory() as d:
            checkpoint = _save(d, "shard", rank) if rank == 1 else None
            train.report({"rank": rank}, checkpoint=checkpoint)

    result = DataParallelTrainer(
        train_func, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
    ).fit()
    assert result.metrics == {"rank": 0}
    with result.checkpoint.as_directory() as d:
        assert "shard" in os.listdir(d)
        assert Path(os.path.join(d, "shard")).read_text() == "1"


def test_retention_by_score_keeps_the_best(storage):
    def train_func():
        for step, acc in enumerate([0.5, 0.9, 0.1, 0.7, 0.3]):
            with tempfile.TemporaryDirectory() as d:
                train.report({"acc": acc, "step": step}, checkpoint=_save(d, "step", step))

    result = DataParallelTrainer(
        train_func,
        run_config=RunConfig(
            storage_path=storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order="max"
            ),
        ),
    ).fit()
    kept = sorted(m["step"] for _, m in result.best_checkpoints)
    assert kept == [1, 3, 4]  # the two best, and the latest until a newer one commits
    left = sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint_0"))
    assert left == ["checkpoint_000001", "checkpoint_000003", "checkpoint_000004"]
    assert result.get_best_checkpoint("acc", "max").path.endswith("checkpoint_000001")


def _set_value(value: str) -> None:
    os.environ["BACKEND_VALUE"] = value


def _unset_value() -> None:
    del os.environ["BACKEND_VALUE"]


class _FlagBackend(Backend):
    def on_start(self, worker_group, backend_config):
        worker_group.execute(_set_value, str(backend_config.value))

    def on_shutdown(self, worker_group, backend_config):
        worker_group.execute(_unset_value)


@dataclass
class _FlagConfig(BackendConfig):
    value: int = 7

    @property
    def backend_cls(self):
        return _FlagBackend


def test_custom_backend_sets_up_every_worker(storage):
    def train_func():
        train.report({"value": os.environ["BACKEND_VALUE"]})

    result = DataParallelTrainer(
        train_func,
        backend_config=_FlagConfig(value=3),
        scaling_config=TWO,
        run_config=RunConfig(storage_path=storage),
    ).fit()
    assert set(result.all_ranks_metrics_dataframe["value"]) == {"3"}


def test_user_callbacks_see_every_round_and_the_failure(storage):
    events = []

    class Recorder(train.UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            events.append(("report", [m["rank"] for m in metrics], checkpoint is not None))

        def after_exception(self, run_context, worker_exceptions):
            events.append(("exception", sorted(worker_exceptions)))

    def train_func():
        rank = train.get_context().get_world_rank()
        with tempfile.TemporaryDirectory() as d:
            train.report({"rank": rank}, checkpoint=_save(d, "r", rank))
        if rank == 1:
            raise KeyError("bad batch")

    with pytest.raises(train.WorkerGroupError) as info:
        DataParallelTrainer(
            train_func,
            scaling_config=TWO,
            run_config=RunConfig(storage_path=storage, callbacks=[Recorder()]),
        ).fit()
    assert events == [("report", [0, 1], True), ("exception", [1])]
    failure = info.value.worker_failures[1]
    assert isinstance(failure.exception, KeyError)
    assert info.value.result.checkpoint is not None  # the committed round is kept


def test_errors_are_clear_and_early():
    with pytest.raises(ConfigError, match="min_workers <= max_workers"):
        ScalingConfig(num_workers=(4, 1))
    with pytest.raises(ConfigError, match="topology"):
        ScalingConfig(num_workers=2, use_tpu=True, topology="2x2")
    with pytest.raises(ConfigError, match="label_selector"):
        ScalingConfig(num_workers=2, label_selector=[{"zone": "a"}])
    with pytest.raises(ConfigError, match="use_gpu"):
        ScalingConfig(use_gpu=True, use_tpu=True)
    with pytest.raises(ConfigError, match="log_level"):
        train.LoggingConfig(log_level="LOUD")
    with pytest.raises(ConfigError, match="relax_collectives_on_preemption"):
        FailureConfig(relax_collectives_on_preemption="yes")
    with pytest.raises(ConfigError, match="label_selector"):
        DataParallelTrainer(
            lambda: None, scaling_config=ScalingConfig(label_selector={"zone": "a"})
        ).fit()
    with pytest.raises(ConfigError, match="TPU"):
        DataParallelTrainer(lambda: None, scaling_config=ScalingConfig(use_tpu=True)).fit()


def test_ray_v2_configs_are_accepted(storage):
    """Fields Ray 2.60 scripts pass: accepted, and honoured where they mean something here."""
    run_config = RunConfig(
        storage_path=storage,
        failure_config=FailureConfig(
            max_failures=0, controller_failure_limit=-1, relax_collectives_on_preemption=True
        ),
        logging_config=train.LoggingConfig(log_level="debug"),
        sync_config=train.SyncConfig(),
    )
    assert run_config.logging_config.log_level == "DEBUG"
    scaling = ScalingConfig(num_workers=1, elastic_resize_monitor_interval_s=5.0)
    assert (scaling.min_workers, scaling.max_workers, scaling.elasticity_enabled) == (1, 1, False)
    elastic = ScalingConfig(num_workers=(1, 4))
    assert (elastic.min_workers, elastic.max_workers, elastic.elasticity_enabled) == (1, 4, True)
    assert train.CheckpointUploadMode.ASYNC.default_delete_local_checkpoint_after_upload()
    assert train.TRAIN_DATASET_KEY == "train"

    def train_func():
        train.report({"shard": train.get_dataset_shard() is not None})

    class Levels(logging.Handler):  # the phalanx logger's level while fit() runs
        seen: list[int] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.seen.append(logging.getLogger("phalanx").getEffectiveLevel())

    phalanx_logger = logging.getLogger("phalanx")
    level, handler = phalanx_logger.level, Levels()
    phalanx_logger.addHandler(handler)
    try:
        result = DataParallelTrainer(
            train_func, scaling_config=scaling, run_config=run_config
        ).fit()
    finally:
        phalanx_logger.removeHandler(handler)
    assert handler.seen and set(handler.seen) == {logging.DEBUG}  # LoggingConfig honoured
    assert phalanx_logger.level == level  # and the user's own level is back after fit()
    assert result.metrics == {"shard": False}


MODES = train.CheckpointUploadMode
# (rank 0's mode, rank 1's mode) per iteration; None: no checkpoint from that rank
MIXED = [
    (MODES.ASYNC, MODES.SYNC),
    (MODES.SYNC, MODES.NO_UPLOAD),
    (MODES.NO_UPLOAD, MODES.ASYNC),
    (MODES.ASYNC, None),
    (None, MODES.SYNC),
]


def test_upload_modes_mixed_across_ranks(storage):
    """Ray's v2 tests mix ASYNC, SYNC, NO_UPLOAD and no checkpoint across ranks in one round;
    each committed checkpoint holds the part of every rank that passed one."""

    def train_func():
        rank = train.get_context().get_world_rank()
        for i, modes in enumerate(MIXED):
            mode = modes[rank]
            name = f"iteration_{i}"
            if mode is None:
                train.report({"i": i}, checkpoint_dir_name=name)
                continue
            if mode is MODES.NO_UPLOAD:
                path = train.get_context().get_storage().build_checkpoint_path_from_name(name)
                os.makedirs(path, exist_ok=True)
                _save(path, f"rank_{rank}", i)
                train.report(
                    {"i": i},
                    checkpoint=Checkpoint(path),
                    checkpoint_dir_name=name,
                    checkpoint_upload_mode=mode,
                )
                continue
            with tempfile.TemporaryDirectory() as d:
                train.report(
                    {"i": i},
                    checkpoint=_save(d, f"rank_{rank}", i),
                    checkpoint_dir_name=name,
                    checkpoint_upload_mode=mode,
                )

    result = DataParallelTrainer(
        train_func, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
    ).fit()
    assert [m["i"] for _, m in result.best_checkpoints] == list(range(len(MIXED)))
    for i, (checkpoint, _) in enumerate(result.best_checkpoints):
        expected = {f"rank_{r}" for r, mode in enumerate(MIXED[i]) if mode is not None}
        with checkpoint.as_directory() as d:
            files = {f for f in os.listdir(d) if f.startswith("rank_")}
            assert files == expected, (i, files)
            assert all(Path(os.path.join(d, f)).read_text() == str(i) for f in files)


def test_only_rank_zero_reports(storage):
    """A training function where only rank 0 calls report(); the others just train."""

    def train_func():
        if train.get_context().get_world_rank() != 0:
            return
        for step in range(3):
            with tempfile.TemporaryDirectory() as d:
                train.report({"step": step}, checkpoint=_save(d, "step", step))

    result = DataParallelTrainer(
        train_func, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
    ).fit()
    assert result.metrics == {"step": 2}
    assert len(result.best_checkpoints) == 3

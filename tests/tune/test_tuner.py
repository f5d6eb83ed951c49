"""Sweeps of function trainables and of Trainers (num_workers=0, in process): what a Ray Tune
user sees from Tuner.fit(), the ResultGrid, early stopping, PBT, failures and the sweep's state."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import phalanx
from phalanx import tune
from phalanx.checkpoint import Checkpoint
from phalanx.config import RunConfig as TrainRunConfig
from phalanx.config import ScalingConfig
from phalanx.errors import ConfigError
from phalanx.trainer import DataParallelTrainer
from phalanx.tune.schedulers import ASHAScheduler, PopulationBasedTraining
from phalanx.tune.search import BasicVariantGenerator


def quadratic(config):
    for step in range(1, 9):
        tune.report({"loss": (config["x"] - 3) ** 2 + 1 / step})


def test_asha_sweep_stops_the_losers_early_and_finds_the_best(tmp_path):
    tuner = tune.Tuner(
        quadratic,
        param_space={"x": tune.grid_search([3, 0, 6, 1, 5, 7, 2, 4])},  # the best first
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            scheduler=ASHAScheduler(max_t=8, grace_period=1, reduction_factor=2),
        ),
        run_config=tune.RunConfig(name="asha", storage_path=str(tmp_path)),
    )
    grid = tuner.fit()
    assert len(grid) == 8 and not grid.errors and grid.num_terminated == 8
    best = grid.get_best_result()
    assert best.config == {"x": 3} and best.metrics["training_iteration"] == 8
    iterations = [r.metrics["training_iteration"] for r in grid]
    assert sum(iterations) < 8 * 8 / 2  # most trials ended at an early rung
    frame = grid.get_dataframe()
    assert list(frame["config/x"]) == [3, 0, 6, 1, 5, 7, 2, 4]
    assert len(best.metrics_dataframe) == 8
    state = json.loads((tmp_path / "asha" / "tuner_state.json").read_text())
    assert state["status"] == "FINISHED" and state["scheduler"] == "AsyncHyperBandScheduler"
    assert [t["iterations"] for t in state["trials"]] == iterations


def test_function_trainable_checkpoints_context_parameters_and_resources(tmp_path):
    seen = []

    def trainable(config, offset):
        context = tune.get_context()
        seen.append((context.get_trial_id(), context.get_trial_name(), context.get_trial_dir()))
        for step in range(3):
            path = tmp_path / f"ckpt_{context.get_trial_id()}_{step}"
            path.mkdir()
            (path / "step").write_text(str(step))
            tune.report({"score": config["a"] + offset}, checkpoint=Checkpoint(str(path)))

    fn = tune.with_resources(tune.with_parameters(trainable, offset=10), {"cpu": 0.5})
    grid = tune.Tuner(
        fn,
        param_space={"a": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(
            name="fn",
            storage_path=str(tmp_path / "s"),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        ),
    ).fit()
    assert [r.metrics["score"] for r in grid] == [11, 12]
    assert grid.get_best_result("score", "max").config == {"a": 2}
    for result in grid:
        assert result.checkpoint is not None and result.path in result.checkpoint.path
        assert (Path(result.checkpoint.path) / "step").read_text() == "2"
        assert sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_")) == [
            "checkpoint_000002"
        ]  # num_to_keep=1
    assert {s[1].startswith("trainable_") for s in seen} == {True}
    assert sorted(s[0] for s in seen) == sorted(r.metrics["trial_id"] for r in grid)


def test_a_failing_trial_is_retried_then_listed_in_errors(tmp_path):
    attempts = []

    def flaky(config):
        attempts.append(config["x"])
        tune.report({"loss": 1.0})
        if config["x"] == 1:
            raise ValueError("bad x")

    grid = tune.Tuner(
        flaky,
        param_space={"x": tune.grid_search([0, 1])},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), failure_config=tune.FailureConfig(max_failures=1)
        ),
    ).fit()
    assert sorted(attempts) == [0, 1, 1]  # one retry
    assert grid.num_errors == 1 and "bad x" in str(grid.errors[0])
    assert grid[0].error is None and grid[1].error is not None


def test_pbt_exploits_the_best_checkpoint_and_reaches_the_optimum(tmp_path):
    optimum = 1.0

    def toy(config):
        score, step = 0.0, 0
        if checkpoint := tune.get_checkpoint():
            with open(os.path.join(checkpoint.path, "state")) as f:
                score, step = json.load(f)
        while step < 30:
            step += 1
            score += 1 - (config["h"] - optimum) ** 2
            path = tmp_path / "scratch" / f"{tune.get_context().get_trial_id()}_{step}"
            path.mkdir(parents=True, exist_ok=True)
            (path / "state").write_text(json.dumps([score, step]))
            tune.report({"score": score, "h": config["h"]}, checkpoint=Checkpoint(str(path)))

    pbt = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=3, seed=0,
        hyperparam_mutations={"h": tune.uniform(0.0, 2.0)}, quantile_fraction=0.5,
        resample_probability=0.5,
    )  # fmt: skip
    grid = tune.Tuner(
        tune.with_resources(toy, {"cpu": 0}),
        param_space={"h": tune.grid_search([0.0, 0.1, 0.2, 0.3])},
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=pbt),
        run_config=tune.RunConfig(storage_path=str(tmp_path)),
    ).fit()
    assert not grid.errors and pbt.num_perturbations > 0
    best = grid.get_best_result()
    without_pbt = 30 * (1 - (0.3 - optimum) ** 2)  # the best initial h, never changed
    assert best.metrics["score"] > without_pbt + 3
    assert abs(best.config["h"] - optimum) < abs(0.3 - optimum)


def test_air_form_trainer_in_the_tuner_with_train_loop_config_merged(tmp_path):
    def train_fn(config):
        for step in range(4):
            phalanx.report({"loss": config["lr"] * (4 - step), "base": config["base"]})

    trainer = DataParallelTrainer(
        train_fn,
        train_loop_config={"base": 7, "lr": 1.0},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=TrainRunConfig(name="air", storage_path=str(tmp_path), verbose=0),
    )
    grid = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 0.2, 0.3])}},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
    ).fit()
    assert grid.experiment_path == str(tmp_path / "air")
    assert [r.metrics["base"] for r in grid] == [7, 7, 7]
    assert grid.get_best_result().config == {"train_loop_config": {"lr": 0.1}}
    runs = sorted(os.listdir(tmp_path / "air"))  # one run directory per trial, in the sweep's
    assert len([r for r in runs if r.startswith("DataParallelTrainer_")]) == 3
    assert phalanx.Result.from_path(grid[0].path).metrics["loss"] == pytest.approx(0.1)


def test_bad_trainables_and_restore_paths_fail_with_a_hint(tmp_path):
    with pytest.raises(ConfigError, match="trainable"):
        tune.Tuner(42)
    with pytest.raises(ConfigError, match="class"):
        tune.Tuner(BasicVariantGenerator)
    assert not tune.Tuner.can_restore(tmp_path)
    with pytest.raises(ConfigError, match="HINT"):
        tune.Tuner.restore(str(tmp_path), trainable=quadratic)
    # a sweep's own directory on S3 is refused at once, saying where S3 does work
    with pytest.raises(ConfigError, match=r"HINT.*Train runs can still store on S3"):
        tune.Tuner(quadratic, run_config=tune.RunConfig(storage_path="s3://bucket/sweeps"))
    assert not tune.Tuner.can_restore("s3://bucket/sweeps/s")
    with pytest.raises(ConfigError, match="local or mounted path"):
        tune.Tuner.restore("s3://bucket/sweeps/s", trainable=quadratic)


def test_ctrl_c_ends_every_trial_at_its_next_report_and_restore_goes_on(tmp_path):
    # Ctrl-C as a terminal delivers it: SIGINT to the main thread, with Python's handler (a run
    # started in the background by a non-interactive shell, `bash .ci/run &`, inherits SIGINT
    # ignored: then no Ctrl-C reaches the sweep, and _thread.interrupt_main() did nothing)
    main = threading.main_thread().ident
    assert main is not None
    interrupted = threading.Event()

    def trainable(config):
        for i in range(20):
            if i == 3 and config["x"] == 1 and not interrupted.is_set():
                interrupted.set()
                signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C in the sweep's driver, once
            time.sleep(0.05)  # the step's work: the trials are still running when it lands
            tune.report({"i": i})

    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0}),
        param_space={"x": tune.grid_search([1, 2])},
        run_config=tune.RunConfig(name="s", storage_path=str(tmp_path)),
    )
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            tuner.fit()
    finally:
        signal.signal(signal.SIGINT, previous)
    state = json.loads((tmp_path / "s" / "tuner_state.json").read_text())
    assert state["status"] == "INTERRUPTED"
    assert [t["status"] for t in state["trials"]] == ["RUNNING", "RUNNING"]  # not finished
    grid = tune.Tuner.restore(str(tmp_path / "s"), trainable).fit()
    assert [r.metrics["i"] for r in grid] == [19, 19] and not grid.errors


def test_time_budget_stops_the_sweep_and_name_creators_name_the_trials(tmp_path):
    def slow(config):
        for i in range(1000):
            time.sleep(0.01)  # the step's work
            tune.report({"i": i})

    grid = tune.Tuner(
        tune.with_resources(slow, {"cpu": 0}),
        param_space={"x": tune.grid_search([1, 2, 3])},
        tune_config=tune.TuneConfig(
            time_budget_s=0.3, trial_dirname_creator=lambda t: f"x{t.config['x']}"
        ),
        run_config=tune.RunConfig(name="budget", storage_path=str(tmp_path)),
    ).fit()
    assert 1 <= len(grid) <= 3 and all(r.metrics["i"] < 999 for r in grid)
    assert [r.path for r in grid] == [str(tmp_path / "budget" / f"x{i}") for i in (1, 2, 3)][
        : len(grid)
    ]

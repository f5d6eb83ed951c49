"""Sweeps whose trials are Train runs on the local engine (Ray V2's form: a driver function
that fits a Trainer with TuneReportCallback): a stopped trial's run ends at its next report
with its checkpoint committed and its workers gone within one report interval (measured), every
rank's metrics reach the trial, and trials too big to run side by side run one after another."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

import phalanx
from phalanx import tune
from phalanx.backend import BackendConfig
from phalanx.checkpoint import Checkpoint
from phalanx.config import RunConfig, ScalingConfig
from phalanx.trainer import DataParallelTrainer
from phalanx.tune.integration.ray_train import TuneReportCallback
from phalanx.tune.schedulers import ASHAScheduler

REPORT_INTERVAL_S = 0.4  # a step's work: the stopped trials run 2 and 4 steps of it
# fit() returned after the stopping report: typically 0.02-0.1 s (under load); 1-2 s when the
# trial's fork server was copied into the server of the trial beside it (that fit() waited for
# the other trial to end: tests/engines/test_forkserver_fds.py). The spec's bound is one report
# interval; two leave room for a loaded machine's teardown.
FREED_CEILING_S = 2 * REPORT_INTERVAL_S


def train_fn_per_worker(config):
    context = phalanx.get_context()
    start = 0
    if checkpoint := phalanx.get_checkpoint():
        start = json.loads((Path(checkpoint.path) / "s").read_text())
    for step in range(start + 1, 7):
        time.sleep(config["interval"])  # the step's work
        metrics = {"loss": (config["x"] - 3) ** 2 + 1 / step, "pid": os.getpid(), "step": step}
        metrics["rank"] = context.get_world_rank()
        if context.get_world_rank() == 0:
            path = os.path.join(config["scratch"], f"{os.getpid()}_{step}")
            os.makedirs(path)
            with open(os.path.join(path, "s"), "w") as f:
                f.write(json.dumps(step))
            phalanx.report(metrics, checkpoint=Checkpoint(path))
        else:
            phalanx.report(metrics)


def driver(config):
    trainer = DataParallelTrainer(
        train_fn_per_worker,
        train_loop_config=config["train_loop_config"],
        scaling_config=ScalingConfig(num_workers=config["workers"]),
        run_config=RunConfig(
            name=f"train-{tune.get_context().get_trial_id()}",
            callbacks=[TuneReportCallback()],
            verbose=0,
        ),
    )
    try:
        trainer.fit()
    finally:
        with open(os.path.join(config["train_loop_config"]["scratch"], "ended.jsonl"), "a") as f:
            f.write(json.dumps([tune.get_context().get_trial_id(), time.time()]) + "\n")


@pytest.mark.slow
def test_a_stopped_trial_ends_its_run_at_that_report_and_frees_its_workers(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    loop = {
        "x": tune.grid_search([3, 0, 6]),
        "interval": REPORT_INTERVAL_S,
        "scratch": str(scratch),
    }
    grid = tune.Tuner(
        driver,
        param_space={"train_loop_config": loop, "workers": 1},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            scheduler=ASHAScheduler(max_t=6, grace_period=2, reduction_factor=2),
        ),
        run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path / "runs")),
    ).fit()
    assert not grid.errors
    assert grid.get_best_result().config["train_loop_config"]["x"] == 3
    ended = dict(json.loads(line) for line in (scratch / "ended.jsonl").read_text().splitlines())
    stopped = [r for r in grid if r.metrics["training_iteration"] < 6]
    assert stopped, [r.metrics["training_iteration"] for r in grid]
    for result in stopped:
        last = result.metrics
        # fit() returned, every worker stopped, within one report interval of the decision
        freed_s = ended[last["trial_id"]] - last["timestamp"]
        print(f"trial {last['trial_id']}: workers gone {freed_s:.3f} s after the stopping report")
        assert freed_s < FREED_CEILING_S, f"fit() returned {freed_s:.2f} s after the stop"
        assert not psutil.pid_exists(last["pid"]) or (
            psutil.Process(last["pid"]).status() == psutil.STATUS_ZOMBIE
        )
        # the worker ran no step after the one in flight when the decision came
        steps = {int(p.name.split("_")[1]) for p in scratch.glob(f"{last['pid']}_*")}
        assert max(steps) <= last["step"] + 1, sorted(steps)
        run = phalanx.Result.from_path(result.path)  # the stopping round's checkpoint committed
        assert run.metrics["step"] == last["step"]
        assert run.checkpoint is not None and result.checkpoint == run.checkpoint
        assert last["all_ranks"] == [{k: last[k] for k in ("loss", "pid", "step", "rank")}]


@pytest.mark.slow
def test_two_worker_trials_on_two_cores_run_one_after_another(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    loop = {"x": tune.grid_search([1, 2]), "interval": 0.0, "scratch": str(scratch)}
    grid = tune.Tuner(
        driver,
        param_space={"train_loop_config": loop, "workers": os.cpu_count()},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path / "runs")),
    ).fit()
    assert not grid.errors and len(grid) == 2
    windows = sorted(
        (r.metrics_dataframe["timestamp"].min(), r.metrics_dataframe["timestamp"].max())
        for r in grid
    )
    assert windows[0][1] < windows[1][0]  # the second trial's run began after the first's ended
    for result in grid:  # every rank's metrics, rank 0's at the top level
        ranks = result.metrics["all_ranks"]
        assert [m["rank"] for m in ranks] == list(range(os.cpu_count() or 1))
        assert result.metrics["rank"] == 0


def report_imported(config):
    # at the first line: did this worker start with the backend's module already imported?
    phalanx.report({"loss": 0.0, "had": config["module"] in sys.modules, "pid": os.getpid()})


@dataclasses.dataclass
class _PreloadingConfig(BackendConfig):
    module: str = ""

    @property
    def preload_modules(self) -> tuple[str, ...]:
        return (self.module,)


def preloading_driver(config):
    DataParallelTrainer(
        report_imported,
        train_loop_config=config,
        backend_config=_PreloadingConfig(module=config["module"]),
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(verbose=0),
    ).fit()


@pytest.mark.slow
def test_the_trials_workers_start_with_the_backends_modules_imported_once(tmp_path, monkeypatch):
    # TorchTrainer's preload module, torch._dynamo, is over a second of CPU in each new worker
    # (the first optimizer imports it): the sweep's driver imports it once for every trial
    module = f"phalanx_test_preload_{os.getpid()}"
    log = tmp_path / "imported_in.txt"
    (tmp_path / f"{module}.py").write_text(
        f"import os\nwith open({str(log)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    grid = tune.Tuner(
        preloading_driver,
        param_space={"module": module, "x": tune.grid_search([1, 2, 3])},
        run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path / "runs")),
    ).fit()
    assert not grid.errors and len(grid) == 3
    assert [r.metrics["had"] for r in grid] == [True, True, True]
    assert log.read_text().split() == [str(os.getpid())]  # in the driver, once

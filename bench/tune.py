#!/usr/bin/env python
"""B15 sweeps: a 16-trial ASHA sweep of a small TorchTrainer job, phalanx.tune vs Ray Tune +
Ray Train 2.60, side by side.

Run from the repository root:

    python bench/tune.py                          # both systems, 3 reps, 16 trials
    python bench/tune.py --reps 1 --trials 4      # a quick check

Each trial is Ray Train V2's form: a driver function that fits a 1-worker TorchTrainer (a
Linear(32, 1) on 256 random rows, one SGD step per round, ``--steps`` rounds, a report per
round) with ``TuneReportCallback``; ``ASHAScheduler(max_t=steps, grace_period=1,
reduction_factor=2)`` on the loss, the learning rate on a log grid. phalanx sizes concurrency
itself; Ray needs it by hand on 2 cores: the trial's driver is given 0 CPUs (and one unit of
a custom ``trial_driver`` resource, as Ray refuses an empty request:
``tune.with_resources(driver, {"cpu": 0, "trial_driver": 1})``) and
``max_concurrent_trials=2``, the fastest setting that places at all (a driver CPU each leaves no
CPU for the workers).

Measured: ``wall_s`` (``Tuner(...)`` to ``fit()`` returned, imports excluded), ``loop_s`` (the
sum over trials of the training function's time, first line to its last report) and
``overhead_per_trial_s = (wall_s - loop_s / 2) / trials``: what the sweep costs per trial
beyond its training on 2 cores. Every run is a fresh subprocess (bench/harness.py),
interleaved. Results: bench/results/tune.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import harness

Record = dict[str, Any]
SYSTEMS = ["phalanx", "raytune"]
COLUMNS = [
    ("wall_s", "sweep wall s"),
    ("loop_s", "training s (sum)"),
    ("overhead_per_trial_s", "overhead per trial s"),
    ("iterations", "rounds run"),
]
CORES = 2


def train_fn_per_worker(config: dict[str, Any]) -> None:
    import torch

    if config["system"] == "phalanx":
        from phalanx import report
    else:
        from ray.train import report
    start = time.time()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    x = torch.randn(256, 32)
    y = x.sum(dim=1, keepdim=True)
    for step in range(config["steps"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with open(config["marks"], "a") as f:
            f.write(json.dumps([config["lr"], start, time.time()]) + "\n")
        report({"loss": loss.item(), "step": step})


def _phalanx_sweep(args: argparse.Namespace, marks: str, storage: str) -> Any:
    from phalanx import RunConfig as TrainRunConfig
    from phalanx import ScalingConfig, tune
    from phalanx.torch import TorchTrainer
    from phalanx.tune.integration.ray_train import TuneReportCallback
    from phalanx.tune.schedulers import ASHAScheduler

    def driver(config: dict[str, Any]) -> None:
        TorchTrainer(
            train_fn_per_worker,
            train_loop_config=config["train_loop_config"],
            scaling_config=ScalingConfig(num_workers=1),
            run_config=TrainRunConfig(
                name=f"train-{tune.get_context().get_trial_id()}",
                callbacks=[TuneReportCallback()],
                verbose=0,
            ),
        ).fit()

    start = time.perf_counter()
    grid = tune.Tuner(
        driver,
        param_space={"train_loop_config": _loop_config(args, "phalanx", marks)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            scheduler=ASHAScheduler(max_t=args.steps, grace_period=1, reduction_factor=2),
        ),
        run_config=tune.RunConfig(name="b15", storage_path=storage, verbose=0),
    ).fit()
    return time.perf_counter() - start, len(grid), len(grid.errors)


def _ray_sweep(args: argparse.Namespace, marks: str, storage: str) -> Any:
    import ray
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback
    from ray.tune.schedulers import ASHAScheduler

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    # a custom resource per driver: Ray rejects a trial that asks for nothing at all
    ray.init(
        num_cpus=CORES,
        resources={"trial_driver": CORES},
        include_dashboard=False,
        log_to_driver=False,
    )

    def driver(config: dict[str, Any]) -> None:
        TorchTrainer(
            train_fn_per_worker,
            train_loop_config=config["train_loop_config"],
            scaling_config=ray.train.ScalingConfig(num_workers=1),
            run_config=ray.train.RunConfig(
                name=f"train-{tune.get_context().get_trial_id()}",
                storage_path=storage,
                callbacks=[TuneReportCallback()],
            ),
        ).fit()

    start = time.perf_counter()
    grid = tune.Tuner(
        tune.with_resources(driver, {"cpu": 0, "trial_driver": 1}),
        param_space={"train_loop_config": _loop_config(args, "raytune", marks)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            max_concurrent_trials=CORES,
            scheduler=ASHAScheduler(max_t=args.steps, grace_period=1, reduction_factor=2),
        ),
        run_config=tune.RunConfig(name="b15", storage_path=storage, verbose=0),
    ).fit()
    wall = time.perf_counter() - start
    ray.shutdown()
    return wall, len(grid), len(grid.errors)


def _loop_config(args: argparse.Namespace, system: str, marks: str) -> dict[str, Any]:
    rates = [10 ** (-3 + 2.5 * i / max(args.trials - 1, 1)) for i in range(args.trials)]
    order = sorted(range(args.trials), key=lambda i: (i * 7) % args.trials)  # not monotone
    return {
        "lr": {"grid_search": [rates[i] for i in order]},  # tune.grid_search, both systems
        "steps": args.steps,
        "system": system,
        "marks": marks,
    }


def run_one(args: argparse.Namespace) -> Record:
    import torch

    torch.set_num_threads(1)
    work = Path(args.work_dir)
    marks = str(work / "marks.jsonl")
    storage = str(work / "storage")
    sweep = _phalanx_sweep if args.one == "phalanx" else _ray_sweep
    wall, trials, errors = sweep(args, marks, storage)
    spans: dict[float, list[float]] = {}
    rounds = 0
    for line in Path(marks).read_text().splitlines():
        lr, start, end = json.loads(line)
        rounds += 1
        span = spans.setdefault(lr, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    loop = sum(end - start for start, end in spans.values())
    return {
        "wall_s": wall,
        "loop_s": loop,
        "overhead_per_trial_s": (wall - loop / CORES) / args.trials,
        "iterations": rounds,
        "trials": trials,
        "errors": errors,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--steps", type=int, default=8, help="rounds per trial (ASHA's max_t)")


def workload(meta: Record) -> list[str]:
    return [
        f"- workload: {meta['trials']} trials (lr on a log grid), each a driver function "
        f"fitting a 1-worker TorchTrainer (Linear(32, 1), 256 rows, {meta['steps']} rounds, "
        "a report per round) with TuneReportCallback; ASHAScheduler(max_t=steps, "
        "grace_period=1, reduction_factor=2) on the loss",
        "- phalanx: concurrency from the trials' ScalingConfigs; Ray Tune: driver given 0 CPUs "
        "(and a custom trial_driver resource), max_concurrent_trials=2 (by hand); "
        "ray.init(num_cpus=2)",
        "- overhead per trial = (wall - training time summed / 2 cores) / trials",
    ]


def report(runs: list[Record], meta: Record) -> list[str]:
    systems = meta["systems"]
    lines = harness.table(runs, systems, COLUMNS, digits=3)
    pairs = harness.pairs_of(systems, [("phalanx", "raytune")])
    lines += ["", *harness.ratio_table(runs, pairs, COLUMNS[:3])]
    overhead = list(harness.vals(runs, "phalanx", "overhead_per_trial_s").values())
    if overhead:
        lines += [
            "",
            f"Target: overhead <= 0.2 s per trial (phalanx median "
            f"{sorted(overhead)[len(overhead) // 2]:.3f} s) and wall <= 0.2x Ray Tune.",
        ]
    return lines


BENCH = harness.Bench(
    name="tune",
    title="B15 sweeps: a 16-trial ASHA sweep of a TorchTrainer job, phalanx.tune vs Ray Tune",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("wall_s", "loop_s", "overhead_per_trial_s", "iterations"),
    ok=lambda rec: rec.get("errors") == 0 and rec.get("trials", 0) > 0,
    timeout_s=900.0,
    own_session=True,
    marked=True,
    digits=3,
)


if __name__ == "__main__":
    sys.exit(harness.main(BENCH))

#!/usr/bin/env python
"""B15 sweeps: a 16-trial ASHA sweep of a small TorchTrainer job, phalanx.tune vs Ray Tune +
Ray Train 2.60, side by side.

Run from the repository root:

    python bench/tune.py                          # both systems, 3 reps, 16 trials
    python bench/tune.py --reps 1 --trials 4      # a quick check

Each trial is Ray Train V2's form: a driver function that fits a ``--workers``-worker
TorchTrainer (a Linear(32, 1) on 256 random rows, one SGD step per round, ``--steps`` rounds, a
report per round) with ``TuneReportCallback``; ``ASHAScheduler(max_t=steps, grace_period=1,
reduction_factor=2)`` on the loss, the learning rate on a log grid. phalanx sizes concurrency
itself. Ray needs it by hand on 2 cores: the trial's driver is given 0 CPUs (and one unit of a
custom ``trial_driver`` resource, as Ray refuses an empty request: ``tune.with_resources(driver,
{"cpu": 0, "trial_driver": 1})``) and ``max_concurrent_trials = 2 // workers``, and it needs a
Tune callback that removes the placement group of each stopped trial's Train worker group
(``_FreeLeakedGroups``): without it, on a machine with more than one Ray instance (this shared
one), Ray 2.60 keeps those groups (and their CPUs) until the job ends and the sweep hangs after
its first two trials (``_leaked_groups`` says why). ``--trial-timeout`` bounds the sweep
(Tune's ``time_budget_s`` = timeout x trials; a worker group that cannot be placed fails after
it, ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``).

Measured: ``wall_s`` (``Tuner(...)`` to ``fit()`` returned, imports excluded), ``rounds_s`` (the
sum over trials of the rounds' time: the first round's start to the last report) and
``overhead_per_trial_s = (wall_s - rounds_s / 2) / trials``: what the sweep costs per trial
beyond its training on 2 cores, start-up in the worker included (building the optimizer in a
new worker imports ``torch._dynamo``: over a second). ``outside_fn_per_trial_s`` is the previous
definition, with the whole training function's time (``loop_s``) taken off instead. Every run is
a fresh subprocess (bench/harness.py), interleaved. Results: bench/results/tune.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import harness

Record = dict[str, Any]
SYSTEMS = ["phalanx", "raytune"]
COLUMNS = [
    ("wall_s", "sweep wall s"),
    ("rounds_s", "rounds s (sum)"),
    ("overhead_per_trial_s", "overhead per trial s"),
    ("loop_s", "training fn s (sum)"),
    ("outside_fn_per_trial_s", "outside the fn per trial s"),
    ("iterations", "rounds run"),
    ("trials_reported", "trials that reported"),
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
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])  # torch._dynamo, if new
    x = torch.randn(256, 32)
    y = x.sum(dim=1, keepdim=True)
    ready = time.time()
    for step in range(config["steps"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with open(config["marks"], "a") as f:
            f.write(json.dumps([config["lr"], start, ready, time.time()]) + "\n")
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
            scaling_config=ScalingConfig(num_workers=args.workers),
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
    # a worker group that cannot be placed fails the trial instead of waiting forever
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", str(args.trial_timeout))
    # a custom resource per driver: Ray rejects a trial that asks for nothing at all
    # ("Cannot initialize a ResourceRequest with an empty head and zero worker bundles")
    # the dashboard on (Ray's default): Ray Train V2's placement group cleaner and the
    # workaround below ask Ray's state API, which needs it
    ray.init(num_cpus=CORES, resources={"trial_driver": CORES}, log_to_driver=False)

    def driver(config: dict[str, Any]) -> None:
        TorchTrainer(
            train_fn_per_worker,
            train_loop_config=config["train_loop_config"],
            scaling_config=ray.train.ScalingConfig(num_workers=args.workers),
            run_config=ray.train.RunConfig(
                name=f"train-{tune.get_context().get_trial_id()}",
                storage_path=storage,
                callbacks=[TuneReportCallback()],
            ),
        ).fit()

    start = time.perf_counter()
    grid = tune.Tuner(
        # Ray Train V2's guide: the driver needs no CPU (its controller actor asks for 0);
        # the concurrency is sized by hand: CPUs / the workers of one trial
        tune.with_resources(driver, {"cpu": 0, "trial_driver": 1}),
        param_space={"train_loop_config": _loop_config(args, "raytune", marks)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            max_concurrent_trials=max(CORES // args.workers, 1),
            scheduler=ASHAScheduler(max_t=args.steps, grace_period=1, reduction_factor=2),
            # the per-trial timeout: the sweep ends (and the record says so) instead of hanging
            time_budget_s=args.trial_timeout * args.trials,
        ),
        run_config=tune.RunConfig(
            name="b15", storage_path=storage, verbose=0, callbacks=[_FreeLeakedGroups()]
        ),
    ).fit()
    wall = time.perf_counter() - start
    ray.shutdown()
    return wall, len(grid), len(grid.errors)


def _leaked_groups() -> list[str]:
    """The placement groups of Train worker groups whose workers are all dead.

    Ray 2.60: a trial that Tune stops (ASHA at any rung, and at max_t) is killed with its
    driver, and its Train controller with it, ungracefully. Ray Train V2's
    ``PlacementGroupCleaner`` (a detached actor per run) should then remove the worker group's
    placement group, but it asks the state API without an address, and with more than one Ray
    instance on the machine (other Ray clusters, as on this shared machine) that raises
    ``ConnectionError: Found multiple active Ray instances`` and its monitor thread dies: the
    group keeps its CPUs until the job ends, and on 2 CPUs the next trials' worker groups are
    never placed (the bench's first try timed out at 900 s after 2 trials). A group with a dead
    Train worker and no live actor is such a leftover; a new group has no actor yet."""
    import ray
    from ray.util import state

    address = ray.get_runtime_context().gcs_address
    alive: set[str] = set()
    dead: set[str] = set()
    for actor in state.list_actors(address=address, limit=10_000, detail=True):
        group = actor.placement_group_id
        if not group:
            continue
        if actor.state != "DEAD":
            alive.add(group)
        elif "RayTrainWorker" in (actor.class_name or ""):  # not Tune's own (it may reuse them)
            dead.add(group)
    return sorted(dead - alive)


class _FreeLeakedGroups:
    """A Tune callback removing the groups ``_leaked_groups`` finds after each trial ends: the
    workaround a Ray user needs for this sweep to finish at all."""

    def __new__(cls) -> Any:
        from ray import tune
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        class FreeLeakedGroups(tune.Callback):
            def _free(self) -> None:  # beside Tune's loop: it must not wait for this
                threading.Thread(target=self._free_soon, daemon=True).start()

            def _free_soon(self) -> None:
                import ray

                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline:  # the killed workers' deaths come in late
                    try:
                        leaked = _leaked_groups()
                        for group in leaked:
                            group_id = ray.PlacementGroupID.from_hex(group)
                            remove_placement_group(PlacementGroup(group_id))
                    except Exception as exc:  # ray.shutdown() at the end of the sweep
                        print(f"freeing leaked placement groups: {exc}", file=sys.stderr)
                        return
                    if leaked:
                        return
                    time.sleep(0.2)

            def on_trial_complete(
                self, iteration: int, trials: Any, trial: Any, **info: Any
            ) -> None:
                self._free()

            def on_trial_error(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
                self._free()

        return FreeLeakedGroups()


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
    spans: dict[float, list[float]] = {}  # lr -> [first line, rounds begin, last report]
    rounds = 0
    for line in Path(marks).read_text().splitlines():
        lr, start, ready, end = json.loads(line)
        rounds += 1
        span = spans.setdefault(lr, [start, ready, end])
        span[0], span[1], span[2] = min(span[0], start), min(span[1], ready), max(span[2], end)
    loop = sum(end - start for start, _, end in spans.values())
    work_s = sum(end - ready for _, ready, end in spans.values())
    return {
        "wall_s": wall,
        "rounds_s": work_s,
        "overhead_per_trial_s": (wall - work_s / CORES) / args.trials,
        "loop_s": loop,
        "outside_fn_per_trial_s": (wall - loop / CORES) / args.trials,
        "iterations": rounds,
        "trials": trials,
        "trials_reported": len(spans),
        "errors": errors,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--steps", type=int, default=8, help="rounds per trial (ASHA's max_t)")
    p.add_argument("--workers", type=int, default=1, help="Train workers per trial")
    p.add_argument("--trial-timeout", type=float, default=120.0, help="seconds one trial may take")


def workload(meta: Record) -> list[str]:
    return [
        f"- workload: {meta['trials']} trials (lr on a log grid), each a driver function "
        f"fitting a {meta.get('workers', 1)}-worker TorchTrainer (Linear(32, 1), 256 rows, "
        f"{meta['steps']} rounds, "
        "a report per round) with TuneReportCallback; ASHAScheduler(max_t=steps, "
        "grace_period=1, reduction_factor=2) on the loss",
        "- phalanx: concurrency from the trials' ScalingConfigs; Ray Tune + Ray Train V2: driver "
        "given 0 CPUs (and a custom trial_driver resource), max_concurrent_trials=2 // workers "
        "(by hand), ray.init(num_cpus=2), a callback removing each stopped trial's leaked "
        "worker placement group (else the sweep hangs after 2 trials)",
        "- overhead per trial = (wall - rounds' time summed / 2 cores) / trials (start-up in "
        "the worker included); outside the fn = (wall - training fn time summed / 2) / trials",
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
    summary_keys=("wall_s", "rounds_s", "overhead_per_trial_s", "iterations", "trials_reported"),
    # every trial reported (a sweep ended by its time budget has trials that never did)
    ok=lambda rec: (
        rec.get("errors") == 0 and rec.get("trials_reported") == rec.get("trials", 0) > 0
    ),
    timeout_s=900.0,
    own_session=True,
    marked=True,
    digits=3,
)


if __name__ == "__main__":
    sys.exit(harness.main(BENCH))

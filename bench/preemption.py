#!/usr/bin/env python
"""What a preemption notice (SIGTERM to a worker) costs: steps lost, and time to train again.

Run from the repository root:

    python bench/preemption.py                     # 2 workers, 60 steps of 50 ms, 3 reps
    python bench/preemption.py --reps 5 --sigterm-step 45

Workload: a data-parallel loop (``DataParallelTrainer``, 2 local workers); every step sleeps
``--step-s``, then every rank reports, rank 0 with a checkpoint (a file holding the step) every
``--ckpt-every`` steps; on restart every rank resumes after the checkpoint's step. On the first
attempt rank 1 sends itself SIGTERM after step ``--sigterm-step`` (what a spot reclaim does);
``FailureConfig(preemption_grace_s=30)`` (the default), ``max_failures=0`` (a preemption has
its own budget). Two loops:

- ``notice``: also checkpoints (rank 0) in every round once ``phalanx.get_preemption_info()``
  is not None, so the stop round carries a checkpoint (docs/guides/failures.md's recipe).
- ``periodic``: ignores the notice: the run resumes from the last periodic checkpoint.

Measured:

- ``steps_lost``: the furthest step any rank reported in the preempted attempt, minus the step
  of the checkpoint the next attempt resumed from (work done twice). Target: <= 1 (``notice``).
- ``notice_to_stop_s``: SIGTERM to the end of the preempted attempt's last round (each rank's
  last report).
- ``notice_to_step_s``: SIGTERM to the first step completed by the next attempt's rank 0.

Each run is a fresh subprocess (bench/harness.py), one thread per worker. Results go to
bench/results/preemption.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from common import median

Record = dict[str, Any]
SYSTEMS = ("notice", "periodic")
WORKERS = 2


def _loop(cfg: dict[str, Any]) -> None:
    import phalanx as train

    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    marks = Path(cfg["marks"])
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d:
            start = int(Path(d, "step").read_text()) + 1
    for step in range(start, cfg["steps"]):
        time.sleep(cfg["step_s"])
        if rank == 1 and attempt == 0 and step == cfg["sigterm_step"]:
            (marks / "sigterm").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGTERM)
        if rank == 0 and attempt == 1 and step == start:
            (marks / "resumed").write_text(json.dumps({"t": time.time(), "from_step": start - 1}))
        notice = train.get_preemption_info() is not None and cfg["system"] == "notice"
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if rank == 0 and (step % cfg["ckpt_every"] == 0 or notice):
                Path(d, "step").write_text(str(step))
                checkpoint = train.Checkpoint.from_directory(d)
            train.report({"step": step, "t": time.time()}, checkpoint=checkpoint)


def run_one(args: argparse.Namespace) -> Record:
    import phalanx as train

    marks = Path(args.work_dir) / "marks"
    marks.mkdir()
    cfg = {
        "system": args.one,
        "steps": args.steps,
        "step_s": args.step_s,
        "ckpt_every": args.ckpt_every,
        "sigterm_step": args.sigterm_step,
        "marks": str(marks),
    }
    t0 = time.time()
    result = train.DataParallelTrainer(
        _loop,
        train_loop_config=cfg,
        scaling_config=train.ScalingConfig(num_workers=WORKERS),
        run_config=train.RunConfig(
            name="preemption",
            storage_path=str(Path(args.work_dir) / "runs"),
            failure_config=train.FailureConfig(max_failures=0, preemption_grace_s=30),
            verbose=0,
        ),
    ).fit()
    df = result.all_ranks_metrics_dataframe
    first = df[df["_phalanx_attempt"] == df["_phalanx_attempt"].min()]
    sigterm = float((marks / "sigterm").read_text())
    resumed = json.loads((marks / "resumed").read_text())
    return {
        "attempts": result.attempts,
        "steps_lost": int(first["step"].max()) - resumed["from_step"],
        "notice_to_stop_s": float(first["t"].max()) - sigterm,
        "notice_to_step_s": resumed["t"] - sigterm,
        "fit_total_s": time.time() - t0,
        "final_step": int(df["step"].max()),
    }


COLUMNS = [
    ("steps_lost", "steps lost"),
    ("notice_to_stop_s", "SIGTERM → last round"),
    ("notice_to_step_s", "SIGTERM → first step again"),
    ("fit_total_s", "fit() total"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-s", type=float, default=0.05, help="seconds per step")
    p.add_argument("--ckpt-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--sigterm-step", type=int, default=35, help="rank 1 gets SIGTERM after it")


def workload(meta: Record) -> list[str]:
    return [
        f"- workload: {WORKERS} local workers, {meta['steps']} steps of {meta['step_s']} s "
        f"(sleep), every rank reports every step, rank 0 checkpoints every "
        f"{meta['ckpt_every']} steps; rank 1 gets SIGTERM after step {meta['sigterm_step']} "
        "of the first attempt; preemption_grace_s=30 (default); max_failures=0",
        "- notice: rank 0 also checkpoints every round once get_preemption_info() is set; "
        "periodic: it does not. steps lost: furthest step reported before the preemption minus "
        "the step resumed from.",
    ]


def report(runs: list[Record], meta: Record) -> list[str]:
    lines = harness.table(runs, meta["systems"], COLUMNS, digits=3)
    lost = [r["steps_lost"] for r in runs if r["system"] == "notice" and r["ok"]]
    if lost:
        lines += [
            "",
            f"- target: <= 1 step lost with a 30 s grace; notice: median {median(lost):g}, "
            f"max {max(lost)} step(s) lost",
        ]
    return lines


BENCH = harness.Bench(
    name="preemption",
    title="Preemption: what a SIGTERM to a worker costs (steps lost, time to train again)",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("steps_lost", "notice_to_stop_s", "notice_to_step_s", "fit_total_s"),
    ok=lambda rec: rec.get("attempts") == 2 and rec.get("final_step") is not None,
    timeout_s=300.0,
    own_session=True,
    digits=3,
)


if __name__ == "__main__":
    harness.main(BENCH)

#!/usr/bin/env python
"""B3 with the progress view: does the view slow ``report()``?

Run from the repository root:

    python bench/report_progress.py                     # 5 reps, 2,000 steps
    python bench/report_progress.py --reps 1 --steps 50 --out /tmp/rp  # smoke run

Two settings, interleaved A B A B ... in fresh subprocesses (bench/harness.py): ``verbose=0`` (no view, no log
lines) and ``verbose=1`` (the default: the status line, redrawn on every committed round and
twice a second). The driver's output is a pseudo-terminal, so the view really draws. Each run:
2 local workers, ``--steps`` steps of 1 ms busy work with ``report()`` every step; rank 0 times
each call. Results go to bench/results/report_progress.{md,json}: p50/p99 per setting (median
over reps), the run's wall time and the paired ratio view / verbose0.
"""

from __future__ import annotations

import argparse
import os
import pty
import sys
import tempfile
import threading
import time
from typing import Any

import harness
from common import spin

SETTINGS = {"verbose0": 0, "view": 1}
BUSY_S = 0.001
PAIR = ("view", "verbose0")
COLUMNS = [("p50_ms", "report() p50 ms"), ("p99_ms", "report() p99 ms"), ("wall_s", "wall s")]


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """In the run's subprocess: one fit() whose driver output is a pseudo-terminal."""
    with DriverOutputOnAPty():
        return one(SETTINGS[args.one], args.steps)


def one(verbose: int, steps: int) -> dict[str, Any]:
    import phalanx
    from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

    def loop(config: dict[str, Any]) -> list[float]:
        times = []
        for step in range(config["steps"]):
            spin(BUSY_S)
            start = time.perf_counter()
            phalanx.report({"loss": 1.0 / (step + 1), "step": step})
            times.append(time.perf_counter() - start)
        return times

    with tempfile.TemporaryDirectory() as storage:
        started = time.perf_counter()
        result = DataParallelTrainer(
            loop,
            train_loop_config={"steps": steps},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="bench", storage_path=storage, verbose=verbose),
        ).fit()
        wall = time.perf_counter() - started
    times = sorted(result.return_value)
    return {
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[-max(1, len(times) // 100)],
        "wall_s": wall,
    }


class DriverOutputOnAPty:
    """Points this process's stdout and stderr at a pseudo-terminal, so the progress view really
    draws; what it draws is copied to the run's log (the harness's stdout)."""

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.log = os.dup(1)
        self.saved_err = os.dup(2)
        self.master, slave = pty.openpty()
        os.dup2(slave, 1)
        os.dup2(slave, 2)
        os.close(slave)
        self.copier = threading.Thread(target=_copy, args=(self.master, self.log), daemon=True)
        self.copier.start()

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.log, 1)
        os.dup2(self.saved_err, 2)  # the terminal's last opening closes: the copier sees EIO
        self.copier.join(timeout=10)
        os.close(self.master)
        os.close(self.saved_err)


def _copy(fd: int, out: int) -> None:
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: every opening of the terminal is closed
            return
        if not data:
            return
        os.write(out, data)


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    return [
        *harness.table(runs, meta["systems"], COLUMNS, digits=3),
        "",
        *harness.ratio_table(runs, harness.pairs_of(meta["systems"], [PAIR]), COLUMNS),
    ]


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- each run: 2 local workers, {meta['steps']} steps of {BUSY_S * 1000:g} ms busy work "
        "with report() every step, timed on rank 0 (the run's p50/p99); driver output on a "
        "pseudo-terminal; `verbose0`: RunConfig(verbose=0), `view`: verbose=1 (the status line)"
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=2000)


BENCH = harness.Bench.of(
    sys.modules[__name__],
    name="report_progress",
    title="B3 with the progress view: does the view slow report()?",
    systems=tuple(SETTINGS),
    summary_keys=("p50_ms", "p99_ms", "wall_s"),
    reps=5,
    timeout_s=600.0,
    digits=3,
)


if __name__ == "__main__":
    harness.main(BENCH)

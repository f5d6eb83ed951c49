#!/usr/bin/env python
"""A driver that initialised CUDA, then fit() with 2 local workers that use CUDA (needs a GPU).

    python bench/cuda_start.py                       # every case, 1 rep
    python bench/cuda_start.py --systems auto,fork_clean --reps 3

The cases (each run a fresh subprocess of this script, bench/harness.py):

  fork_clean        CUDA untouched in the driver: the fork path
  auto              CUDA initialised first: workers fork from a fresh interpreter that imported
                    torch (one import)
  spawn_each        the same with PHALANX_START_METHOD=spawn: one interpreter per worker
  forced_fork       the same with PHALANX_START_METHOD=fork: a ConfigError with a HINT
  unprotected_fork  the check disabled: what it prevents

Records fit() -> first line of the training fn (all ranks) and what each worker computed on the
GPU, or the error the case ends with. Results go to bench/results/cuda_start.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import harness
import torch

import phalanx as train
from phalanx import ConfigError, DataParallelTrainer, RunConfig, ScalingConfig, TrainingFailedError
from phalanx._internal.engines.local import start_method

FITS = ("fork_clean", "auto", "spawn_each")
START_METHOD = {"spawn_each": "spawn", "forced_fork": "fork", "unprotected_fork": "fork"}


def loop() -> None:
    t = time.time()
    import torch

    total = torch.ones(1000, device="cuda").sum().item()
    train.report({"t_first": t, "sum": total, "device": torch.cuda.get_device_name(0)})


def fit() -> dict[str, Any]:
    storage = tempfile.mkdtemp()
    start = time.time()
    result = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=storage),
    ).fit()
    frame = result.all_ranks_metrics_dataframe
    first = float(frame["t_first"].max()) - start
    return {
        "first_line_s": round(first, 3),
        "sums": [float(s) for s in frame["sum"]],
        "device": str(frame["device"][0]),
    }


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    mode = args.one
    if mode in START_METHOD:
        os.environ["PHALANX_START_METHOD"] = START_METHOD[mode]
    if mode != "fork_clean":
        torch.zeros(1, device="cuda")  # the driver initialises CUDA (a model moved to the GPU)
    if mode in FITS:
        return fit()
    if mode == "forced_fork":
        try:
            fit()
        except ConfigError as exc:
            return {"error": f"ConfigError: {exc}"}
        return {"error": "none: fit() returned"}
    start_method.fork_unsafe_runtime = lambda: None  # type: ignore[assignment]
    try:
        fit()
    except TrainingFailedError as exc:
        return {"error": "TrainingFailedError: " + " / ".join(
            s.strip() for s in str(exc).splitlines() if "CUDA" in s)}  # fmt: skip
    return {"error": "none: fit() returned"}


def ok(rec: dict[str, Any]) -> bool:
    if rec["system"] in FITS:
        return "first_line_s" in rec
    expected = "ConfigError" if rec["system"] == "forced_fork" else "TrainingFailedError"
    return str(rec.get("error", "")).startswith(expected)


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    fits = [s for s in meta["systems"] if s in FITS]
    lines = [*harness.table(runs, fits, [("first_line_s", "fit() -> first line, s")]), ""]
    for run in runs:
        if run["ok"] and run["system"] in FITS:
            lines.append(f"- {run['system']} rep {run['rep']}: {run['device']}, sums {run['sums']}")
        elif run["ok"]:
            lines.append(f"- {run['system']} rep {run['rep']}: {run['error'][:600]}")
    return lines


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        "- each run: a driver (CUDA initialised first except in fork_clean), then fit() with 2 "
        "local workers that each sum a CUDA tensor"
    ]


BENCH = harness.Bench(
    name="cuda_start",
    title="fit() from a driver that initialised CUDA",
    systems=(*FITS, "forced_fork", "unprotected_fork"),
    run_one=run_one,
    add_arguments=lambda p: None,
    workload=workload,
    report=report,
    summary_keys=("first_line_s",),
    ok=ok,
    reps=1,
    timeout_s=600.0,
    own_session=True,
)


if __name__ == "__main__":
    harness.main(BENCH)

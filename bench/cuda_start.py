#!/usr/bin/env python
"""A driver that initialised CUDA, then fit() with 2 local workers that use CUDA (needs a GPU).

    python bench/cuda_start.py fork_clean   # CUDA untouched in the driver: the fork path
    python bench/cuda_start.py auto         # CUDA initialised first: workers fork from a fresh
                                            # interpreter that imported torch (one import)
    PHALANX_START_METHOD=spawn python bench/cuda_start.py spawn_each  # one interpreter per worker
    PHALANX_START_METHOD=fork python bench/cuda_start.py forced_fork   # a ConfigError with a HINT
    python bench/cuda_start.py unprotected_fork  # the check disabled: what it prevents

Prints fit() → first line of the training fn (all ranks) and what each worker computed on the GPU.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import torch

import phalanx as train
from phalanx import ConfigError, DataParallelTrainer, RunConfig, ScalingConfig, TrainingFailedError
from phalanx._internal.engines.local import start_method


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
        "sums": list(frame["sum"]),
        "device": frame["device"][0],
    }


def main(mode: str) -> None:
    if mode != "fork_clean":
        torch.zeros(1, device="cuda")  # the driver initialises CUDA (a model moved to the GPU)
    if mode in ("fork_clean", "auto", "spawn_each"):
        print(mode, json.dumps(fit()))
    elif mode == "forced_fork":
        try:
            fit()
        except ConfigError as exc:
            print(mode, "ConfigError:", exc)
    elif mode == "unprotected_fork":
        start_method.fork_unsafe_runtime = lambda: None  # type: ignore[assignment]
        os.environ["PHALANX_START_METHOD"] = "fork"
        try:
            fit()
        except TrainingFailedError as exc:
            print(mode, "TrainingFailedError:", [s for s in str(exc).splitlines() if "CUDA" in s])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "auto")

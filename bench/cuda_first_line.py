#!/usr/bin/env python
"""Where a GPU worker's fit() -> first line goes, from a driver that initialised CUDA.

A diagnostic beside bench/checkpoint_state_gpu.py (whose "warm" first line it explains): one
driver, several fit() calls with one worker, printing for each the fork server that started the
worker (parked before the fit or not) and fit() -> first line:

  torch nccl     TorchTrainer, use_gpu=True (process group on NCCL)
  torch gloo     TorchTrainer(torch_config=TorchConfig(backend="gloo")), use_gpu=True
  plain          DataParallelTrainer, use_gpu=True (no process group)

    python bench/cuda_first_line.py            # on a GPU machine
    python bench/cuda_first_line.py --cpu      # a smoke run
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

import phalanx as train
from phalanx import DataParallelTrainer
from phalanx._internal.engines.local import warm_server
from phalanx.torch import TorchConfig, TorchTrainer


def first_line(config: dict) -> None:
    now = time.time()
    train.report({"first_line_s": now - config["called"], "server": os.getppid()})


def by_hand(config: dict) -> None:
    """What TorchTrainer's set-up does on a GPU worker, timed step by step in the function."""
    steps = {"first_line_s": time.time() - config["called"], "server": os.getppid()}
    t0 = time.perf_counter()
    import torch.distributed as dist

    steps["import_dist_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if config["gpu"]:
        torch.cuda.set_device(0)
    steps["set_device_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    steps["init_gloo_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.zeros(1, device="cuda" if config["gpu"] else "cpu").sum().item()
    steps["first_tensor_s"] = time.perf_counter() - t0
    dist.destroy_process_group()
    train.report(steps)


def main() -> None:
    gpu = "--cpu" not in sys.argv
    if gpu:
        torch.zeros(1, device="cuda")  # the driver has initialised CUDA
    if "--importtime" in sys.argv:  # the fork server and its workers print their imports' times
        os.environ["PYTHONPROFILEIMPORTTIME"] = "1"
    storage = tempfile.mkdtemp()
    cases = [
        ("torch nccl", TorchTrainer, {}),
        ("torch nccl", TorchTrainer, {}),
        ("torch gloo", TorchTrainer, {"torch_config": TorchConfig(backend="gloo")}),
        ("plain", DataParallelTrainer, {}),
        ("torch nccl", TorchTrainer, {}),
        ("by hand", DataParallelTrainer, {}),
    ]
    for i, (label, cls, extra) in enumerate(cases):
        parked = warm_server.parked_pid()
        called = time.time()
        result = cls(
            by_hand if label == "by hand" else first_line,
            train_loop_config={"called": called, "gpu": gpu},
            scaling_config=train.ScalingConfig(num_workers=1, use_gpu=gpu),
            run_config=train.RunConfig(storage_path=storage, name=f"fit{i}"),
            **extra,
        ).fit()
        m = result.metrics
        print(
            f"fit {i} {label:11s} first line {m['first_line_s']:.3f} s, fit() {time.time() - called:.3f} s;"
            f" parked server before: {parked}, worker's server: {m['server']}",
            {k: round(v, 3) for k, v in m.items() if k.endswith("_s") and k != "first_line_s"},
            flush=True,
        )


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""B2 DDP parity: the same DDP training under phalanx, raw torch and Ray Train 2.60.

MLP 784-512-512-10 (FashionMNIST-shaped) on synthetic rows, 2 workers, gloo, report per epoch.

    python bench/ddp_parity.py                      # 60k rows, 5 epochs, 3 reps
    python bench/ddp_parity.py --epochs 2 --reps 3  # shorter

Each system trains exactly the same way (same data, seeds, sampler, batch size, optimizer) and
uses what its users use: raw = `torch.multiprocessing.spawn` + `DistributedDataParallel` +
`DistributedSampler`; phalanx = `phalanx.torch.TorchTrainer` + `prepare_model` +
`prepare_data_loader` + `phalanx.report` per epoch; raytrain = `ray.train.torch.TorchTrainer`
+ its `prepare_*` + `ray.train.report` per epoch. Every run is a fresh subprocess
(bench/harness.py), interleaved (raw phalanx raytrain, raw phalanx raytrain, ...), with
OMP_NUM_THREADS=MKL_NUM_THREADS=1 and torch.set_num_threads(1) in every worker.

Measured: in-loop (rank 0, start of epoch 0 to end of the last epoch, reports included), the
CPU time rank 0's process spent in that loop (all its threads: robust on a busy machine), per
epoch, setup (first line of the train fn to the first step: data, process group, DDP), fit()
(the trainer's fit() or mp.spawn), and end-to-end (subprocess launch to exit). Results go to
bench/results/ddp_parity.{md,json}. Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import harness
from harness import Record

SYSTEMS = ("raw", "phalanx", "raytrain")
WORLD_SIZE = 2


# --------------------------------------------------------------------------- worker side


def _prepare_raw(model: Any, loader: Any, rank: int, world: int) -> tuple[Any, Any]:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(loader.dataset, num_replicas=world, rank=rank, shuffle=True)
    return DistributedDataParallel(model), DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler
    )


def _prepare_phalanx(model: Any, loader: Any, rank: int, world: int) -> tuple[Any, Any]:
    from phalanx.torch import prepare_data_loader, prepare_model

    return prepare_model(model), prepare_data_loader(loader)


def _prepare_raytrain(model: Any, loader: Any, rank: int, world: int) -> tuple[Any, Any]:
    from ray.train.torch import prepare_data_loader, prepare_model

    return prepare_model(model), prepare_data_loader(loader)


PREPARE = {"raw": _prepare_raw, "phalanx": _prepare_phalanx, "raytrain": _prepare_raytrain}


def _train(cfg: dict[str, Any], rank: int, world: int, report: Any) -> None:
    """The training loop every system runs; rank 0 writes its timings to cfg['out']."""
    t_first = time.perf_counter()
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(cfg["threads"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg["rows"], 784, generator=g)
    y = (x @ torch.randn(784, 10, generator=g)).argmax(dim=1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    loader = DataLoader(TensorDataset(x, y), batch_size=cfg["batch_size"], shuffle=True)
    model, loader = PREPARE[cfg["system"]](model, loader, rank, world)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    t_loop, cpu_loop = time.perf_counter(), time.process_time()
    epoch_s, losses = [], []
    for epoch in range(cfg["epochs"]):
        t_epoch = time.perf_counter()
        loader.sampler.set_epoch(epoch)
        total = torch.zeros(())
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.detach()
        mean_loss = total.item() / len(loader)
        report({"epoch": epoch, "loss": mean_loss})
        epoch_s.append(time.perf_counter() - t_epoch)
        losses.append(mean_loss)
    t_end, cpu_end = time.perf_counter(), time.process_time()
    if rank == 0:
        record = {
            "setup_s": t_loop - t_first,
            "loop_s": t_end - t_loop,
            "loop_cpu_s": cpu_end - cpu_loop,
            "epoch_s": epoch_s,
            "losses": losses,
            "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "t_done": time.time(),
        }
        Path(cfg["out"]).write_text(json.dumps(record))


def _phalanx_fn(cfg: dict[str, Any]) -> None:
    import phalanx as train

    ctx = train.get_context()
    _train(cfg, ctx.get_world_rank(), ctx.get_world_size(), train.report)


def _raytrain_fn(cfg: dict[str, Any]) -> None:
    import ray.train

    ctx = ray.train.get_context()
    _train(cfg, ctx.get_world_rank(), ctx.get_world_size(), ray.train.report)


def _raw_worker(rank: int, cfg: dict[str, Any]) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    _train(cfg, rank, WORLD_SIZE, lambda metrics: None)
    dist.destroy_process_group()


# --------------------------------------------------------------------------- one run


def _fit_phalanx(cfg: dict[str, Any], tmp: Path) -> Record:
    import phalanx as train
    from phalanx.torch import TorchTrainer

    trainer = TorchTrainer(
        _phalanx_fn,
        train_loop_config=cfg,
        scaling_config=train.ScalingConfig(num_workers=WORLD_SIZE),
        run_config=train.RunConfig(name="b2", storage_path=str(tmp / "store")),
    )
    t0 = time.time()
    result = trainer.fit()
    return {"t_fit": t0, "t_end": time.time(), "reported": len(result.metrics_dataframe)}


def _fit_raytrain(cfg: dict[str, Any], tmp: Path) -> Record:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    t0 = time.perf_counter()
    # address="local": a private cluster, even if another Ray instance runs on this machine.
    ray.init(address="local", num_cpus=WORLD_SIZE, include_dashboard=False)
    init_s = time.perf_counter() - t0
    try:
        trainer = TorchTrainer(
            _raytrain_fn,
            train_loop_config=cfg,
            scaling_config=ScalingConfig(num_workers=WORLD_SIZE),
            run_config=RunConfig(name="b2", storage_path=str(tmp / "store")),
        )
        t_fit = time.time()
        trainer.fit()
        t_end = time.time()
    finally:
        ray.shutdown()
    return {"t_fit": t_fit, "t_end": t_end, "ray_init_s": init_s}


def _fit_raw(cfg: dict[str, Any], tmp: Path) -> Record:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        cfg["port"] = s.getsockname()[1]
    t0 = time.time()
    mp.spawn(_raw_worker, args=(cfg,), nprocs=WORLD_SIZE, join=True, start_method="spawn")
    return {"t_fit": t0, "t_end": time.time()}


FIT = {"raw": _fit_raw, "phalanx": _fit_phalanx, "raytrain": _fit_raytrain}


def run_one(args: argparse.Namespace) -> Record:
    t0 = time.perf_counter()
    import torch  # what every driver script imports first

    torch.set_num_threads(1)
    import_s = time.perf_counter() - t0
    tmp = Path(args.work_dir)  # the harness removes it after the run
    cfg = {
        "system": args.one,
        "rows": args.rows,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "threads": 1,
        "out": str(tmp / "rank0.json"),
    }
    rec = FIT[args.one](cfg, tmp)
    rec.update(json.loads(Path(cfg["out"]).read_text()))
    rec.update(
        import_s=import_s,
        fit_s=rec["t_end"] - rec["t_fit"],
        teardown_s=rec["t_end"] - rec.pop("t_done"),
    )
    return rec


# --------------------------------------------------------------------------- report

COLUMNS = [
    ("loop_s", "in-loop (s)"),
    ("loop_cpu_s", "in-loop CPU, rank 0 (s)"),
    ("epoch_med_s", "median epoch (s)"),
    ("setup_s", "setup (s)"),
    ("fit_s", "fit() (s)"),
    ("e2e_s", "end-to-end (s)"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=60_000)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128, help="per worker")


def workload(meta: Record) -> list[str]:
    return [
        f"- workload: MLP 784-512-512-10, {meta['rows']:,} synthetic rows, {WORLD_SIZE} workers "
        f"(gloo), {meta['epochs']} epochs, batch {meta['batch_size']} per worker, SGD momentum, "
        "report() per epoch (raw: none); 1 thread per worker in every system",
    ]


def report(runs: list[Record], meta: Record) -> list[str]:
    for r in runs:
        if r["ok"]:
            r["epoch_med_s"] = statistics.median(r["epoch_s"])
    systems = meta["systems"]
    wanted = [("phalanx", "raw"), ("phalanx", "raytrain"), ("raytrain", "raw")]
    lines = [*harness.table(runs, systems, COLUMNS), ""]
    lines += harness.ratio_table(runs, harness.pairs_of(systems, wanted), COLUMNS)
    finals = {s: sorted({round(r["losses"][-1], 5) for r in runs if r["system"] == s and r["ok"]})
              for s in systems}  # fmt: skip
    return [*lines, "", f"- final mean training loss per system (identical training): {finals}"]


BENCH = harness.Bench(
    name="ddp_parity",
    title="B2 DDP parity: phalanx vs raw torch vs Ray Train",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("loop_s", "setup_s", "fit_s", "e2e_s"),
)

if __name__ == "__main__":
    harness.main(BENCH)

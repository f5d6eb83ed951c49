#!/usr/bin/env python
"""Lightning DDP: phalanx.lightning vs Lightning's own launcher vs Ray Train 2.60.

The same LightningModule (MLP 784-256-10 on synthetic FashionMNIST-shaped rows), 2 CPU workers,
gloo, one checkpoint per epoch, trained three ways, as each system's users write it:

- phalanx: ``phalanx.torch.TorchTrainer`` + ``pl.Trainer(devices="auto", accelerator="auto",
  strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
  callbacks=[RayTrainReportCallback()])`` from ``phalanx.lightning``;
- lightning: ``pl.Trainer(strategy="ddp", devices=2, accelerator="cpu")`` in a plain script
  (Lightning re-runs the script for rank 1) with its default per-epoch ``ModelCheckpoint``;
- raytrain: the same code as phalanx with ``ray.train.lightning`` / ``ray.train.torch``.

    python bench/lightning_ddp.py                                  # 16k rows, 3 epochs, 3 reps
    python bench/lightning_ddp.py --reps 1 --rows 1024 --epochs 1  # smoke run

Every run is a fresh subprocess (bench/harness.py: interleaved reps), with
OMP_NUM_THREADS=MKL_NUM_THREADS=1 and torch.set_num_threads(1) in every worker. Measured on rank
0: fit() (the outer trainer's fit(), or Lightning's ``trainer.fit`` with its launcher), setup
(first line of the training code to Lightning's ``on_train_start``), in-loop (``on_train_start``
to ``on_train_end``: steps, validation-free epochs, checkpoints, reports), the median step, and
end-to-end (subprocess launch to exit). Results go to bench/results/lightning_ddp.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import harness
from harness import Record

SYSTEMS = ("phalanx", "lightning", "raytrain")
WORLD_SIZE = 2


# --------------------------------------------------------------------------- worker side


def _timer(cfg: dict[str, Any]) -> Any:
    """A Lightning callback recording rank 0's timings (defined here: Lightning is imported late)."""
    import lightning.pytorch as pl

    class Timer(pl.Callback):
        """Rank 0's timings: the training loop and every step."""

        def __init__(self) -> None:
            self.steps: list[float] = []
            self.t_step = 0.0

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            # Lightning's first save_checkpoint asks whether the path is object storage, which
            # imports s3fs where it is installed (0.5-0.8 s here). Lightning's ModelCheckpoint
            # pays that in its setup; do it in setup for every system, so in-loop compares loops.
            from lightning.fabric.utilities.cloud_io import _is_object_storage, get_filesystem

            _is_object_storage(get_filesystem(cfg["tmp"]))

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.t_loop = time.perf_counter()

        def on_train_batch_start(self, *args: Any) -> None:
            self.t_step = time.perf_counter()

        def on_train_batch_end(self, *args: Any) -> None:
            self.steps.append(time.perf_counter() - self.t_step)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.global_rank != 0:
                return
            record = {
                "setup_s": self.t_loop - cfg["t_first"],
                "loop_s": time.perf_counter() - self.t_loop,
                "step_med_ms": 1000 * statistics.median(self.steps),
                "steps": len(self.steps),
                "loss": float(trainer.callback_metrics["loss"]),
            }
            Path(cfg["out"]).write_text(json.dumps(record))

    return Timer()


def _module_and_data(cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("loss", loss, on_epoch=True, on_step=False, sync_dist=False)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg["rows"], 784, generator=g)
    y = (x @ torch.randn(784, 10, generator=g)).argmax(dim=1)
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(x, y), batch_size=cfg["batch_size"], shuffle=True)
    return Classifier(), loader, _timer(cfg)


def _quiet() -> dict[str, Any]:
    return {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}


def _ray_style_fn(cfg: dict[str, Any]) -> None:
    """The training function phalanx and Ray Train run (only the imports differ)."""
    cfg = dict(cfg, t_first=time.perf_counter())
    import lightning.pytorch as pl

    if cfg["system"] == "phalanx":
        import phalanx.lightning as rl
    else:
        import ray.train.lightning as rl  # type: ignore[no-redef]
    model, loader, timer = _module_and_data(cfg)
    trainer = pl.Trainer(
        max_epochs=cfg["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=rl.RayDDPStrategy(),
        plugins=[rl.RayLightningEnvironment()],
        callbacks=[rl.RayTrainReportCallback(), timer],
        enable_checkpointing=False,
        default_root_dir=cfg["tmp"],
        **_quiet(),
    )
    rl.prepare_trainer(trainer).fit(model, train_dataloaders=loader)


# --------------------------------------------------------------------------- one run


def _fit_phalanx(cfg: dict[str, Any], tmp: Path) -> Record:
    import phalanx as train
    from phalanx.torch import TorchTrainer

    trainer = TorchTrainer(
        _ray_style_fn,
        train_loop_config=cfg,
        scaling_config=train.ScalingConfig(num_workers=WORLD_SIZE),
        run_config=train.RunConfig(name="b_lightning", storage_path=str(tmp / "store")),
    )
    t0 = time.perf_counter()
    result = trainer.fit()
    return {"fit_s": time.perf_counter() - t0, "reported": len(result.metrics_dataframe)}


def _fit_raytrain(cfg: dict[str, Any], tmp: Path) -> Record:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=WORLD_SIZE, include_dashboard=False)
    init_s = time.perf_counter() - t0
    try:
        trainer = TorchTrainer(
            _ray_style_fn,
            train_loop_config=cfg,
            scaling_config=ScalingConfig(num_workers=WORLD_SIZE),
            run_config=RunConfig(name="b_lightning", storage_path=str(tmp / "store")),
        )
        t_fit = time.perf_counter()
        trainer.fit()
        fit_s = time.perf_counter() - t_fit
    finally:
        ray.shutdown()
    return {"fit_s": fit_s, "ray_init_s": init_s}


def _fit_lightning(cfg: dict[str, Any], tmp: Path) -> Record:
    """Lightning's own launcher: rank 1 is this script again, started by Lightning."""
    cfg = dict(cfg, t_first=time.perf_counter())
    import lightning.pytorch as pl

    model, loader, timer = _module_and_data(cfg)
    trainer = pl.Trainer(
        max_epochs=cfg["epochs"],
        strategy="ddp",
        devices=WORLD_SIZE,
        accelerator="cpu",
        callbacks=[timer],
        default_root_dir=cfg["tmp"],
        **_quiet(),
    )
    t0 = time.perf_counter()
    trainer.fit(model, train_dataloaders=loader)
    return {"fit_s": time.perf_counter() - t0, "rank": trainer.global_rank}


FIT = {"phalanx": _fit_phalanx, "lightning": _fit_lightning, "raytrain": _fit_raytrain}


def run_one(args: argparse.Namespace) -> Record | None:
    t0 = time.perf_counter()
    import lightning.pytorch  # noqa: F401  (what every driver script imports first)
    import torch

    torch.set_num_threads(1)
    import_s = time.perf_counter() - t0
    # Lightning's launcher re-runs this script for rank 1 with the same arguments: the work
    # directory is named by the parent so that both ranks share it.
    tmp = Path(args.work_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = {
        "system": args.one,
        "rows": args.rows,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "out": str(tmp / "rank0.json"),
        "tmp": str(tmp),
    }
    rec = FIT[args.one](cfg, tmp)
    if rec.get("rank", 0) != 0:
        return None
    rec.update(json.loads(Path(cfg["out"]).read_text()), import_s=import_s)
    return rec


# --------------------------------------------------------------------------- report

COLUMNS = [
    ("fit_s", "fit() (s)"),
    ("setup_s", "setup to on_train_start (s)"),
    ("loop_s", "in-loop (s)"),
    ("step_med_ms", "median step (ms)"),
    ("e2e_s", "end-to-end (s)"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=16_384)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")


def workload(meta: Record) -> list[str]:
    return [
        f"- workload: LightningModule MLP 784-256-10, {meta['rows']:,} synthetic rows, "
        f"{WORLD_SIZE} workers (gloo), {meta['epochs']} epochs, batch {meta['batch_size']} per "
        "worker, one checkpoint per epoch; 1 thread per worker in every system",
    ]


def report(runs: list[Record], meta: Record) -> list[str]:
    systems = meta["systems"]
    lines = [*harness.table(runs, systems, COLUMNS), ""]
    pairs = harness.pairs_of(systems, [("phalanx", "lightning"), ("phalanx", "raytrain")])
    lines += harness.ratio_table(runs, pairs, COLUMNS)
    finals = {s: sorted({round(r["loss"], 4) for r in runs if r["system"] == s and r["ok"]})
              for s in systems}  # fmt: skip
    return [*lines, "", f"- last epoch's mean training loss on rank 0 per system: {finals}"]


BENCH = harness.Bench(
    name="lightning_ddp",
    title="Lightning DDP: phalanx.lightning vs Lightning's launcher vs Ray Train",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("fit_s", "setup_s", "loop_s", "step_med_ms", "e2e_s"),
    extra_versions=("lightning",),
)

if __name__ == "__main__":
    harness.main(BENCH)

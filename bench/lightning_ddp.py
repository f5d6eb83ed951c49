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

Every run is a fresh subprocess (this script with ``--one SYSTEM``), interleaved, with
OMP_NUM_THREADS=MKL_NUM_THREADS=1 and torch.set_num_threads(1) in every worker. Measured on rank
0: fit() (the outer trainer's fit(), or Lightning's ``trainer.fit`` with its launcher), setup
(first line of the training code to Lightning's ``on_train_start``), in-loop (``on_train_start``
to ``on_train_end``: steps, validation-free epochs, checkpoints, reports), the median step, and
end-to-end (subprocess launch to exit). Results go to bench/results/lightning_ddp.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import machine, median, package_version, versions

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("phalanx", "lightning", "raytrain")
WORLD_SIZE = 2
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
Record = dict[str, Any]


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


# --------------------------------------------------------------------------- orchestration


def launch(system: str, rep: int, args: argparse.Namespace, logs: Path) -> Record:
    json_out, log = logs / f"{system}-{rep}.json", logs / f"{system}-{rep}.log"
    work = Path(tempfile.mkdtemp(prefix=f"phxbl-{system}-"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", system, "--json-out",
           str(json_out), "--work-dir", str(work), "--rows", str(args.rows), "--epochs",
           str(args.epochs), "--batch-size", str(args.batch_size)]  # fmt: skip
    env = dict(os.environ, **THREAD_ENV, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    shutil.rmtree(work, ignore_errors=True)
    rec: Record = {"system": system, "rep": rep, "e2e_s": time.perf_counter() - t0, "ok": False}
    if rc == 0 and json_out.exists():
        rec.update(json.loads(json_out.read_text()), ok=True)
    else:
        rec["error"] = f"rc={rc}: " + log.read_text(errors="replace")[-2000:]
    return rec


def _vals(runs: list[Record], system: str, key: str) -> dict[int, float]:
    return {r["rep"]: r[key] for r in runs if r["system"] == system and r["ok"] and key in r}


def _cell(runs: list[Record], system: str, key: str) -> str:
    v = list(_vals(runs, system, key).values())
    return f"{median(v):.2f} ({min(v):.2f}..{max(v):.2f})" if v else "-"


def _ratio(runs: list[Record], key: str, a: str, b: str) -> str:
    va, vb = _vals(runs, a, key), _vals(runs, b, key)
    ratios = [va[k] / vb[k] for k in va.keys() & vb.keys() if vb[k] > 0]
    return f"{median(ratios):.3f}x" if ratios else "-"


COLUMNS = [
    ("fit_s", "fit() (s)"),
    ("setup_s", "setup to on_train_start (s)"),
    ("loop_s", "in-loop (s)"),
    ("step_med_ms", "median step (ms)"),
    ("e2e_s", "end-to-end (s)"),
]


def write_report(runs: list[Record], meta: Record, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    m, v = meta["machine"], meta["versions"]
    lines = [
        "# Lightning DDP: phalanx.lightning vs Lightning's launcher vs Ray Train",
        "",
        f"- date: {meta['date']}; command: `{meta['command']}`",
        f"- machine: {m['nproc']} CPUs, {m['memory_gib']} GiB, {m['cpu_model']}; load avg "
        f"{m['load_start']:.2f} at start, {m['load_end']:.2f} at end",
        f"- versions: Python {v['python']}, torch {v['torch']}, ray {v['ray']}, lightning "
        f"{meta['lightning']}, phalanx {v['phalanx']}",
        f"- workload: LightningModule MLP 784-256-10, {meta['rows']:,} synthetic rows, "
        f"{WORLD_SIZE} workers (gloo), {meta['epochs']} epochs, batch {meta['batch_size']} per "
        "worker, one checkpoint per epoch; 1 thread per worker in every system",
        f"- {meta['reps']} reps, interleaved ({' '.join(meta['systems'])}), each run in its own "
        "subprocess. Median (min..max).",
        "",
        "| system | ok | " + " | ".join(c[1] for c in COLUMNS) + " |",
        "| --- " * (len(COLUMNS) + 2) + "|",
    ]
    for s in meta["systems"]:
        ok = sum(1 for r in runs if r["system"] == s and r["ok"])
        total = sum(1 for r in runs if r["system"] == s)
        cells = " | ".join(_cell(runs, s, key) for key, _ in COLUMNS)
        lines.append(f"| {s} | {ok}/{total} | {cells} |")
    pairs = [(a, b) for a, b in (("phalanx", "lightning"), ("phalanx", "raytrain"))
             if a in meta["systems"] and b in meta["systems"]]  # fmt: skip
    lines += ["", "Ratios: median over reps of (rep i of one / rep i of the other).", ""]
    lines.append("| metric | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |")
    lines.append("| --- " * (len(pairs) + 1) + "|")
    for key, label in COLUMNS:
        lines.append(f"| {label} | " + " | ".join(_ratio(runs, key, a, b) for a, b in pairs) + " |")
    finals = {s: sorted({round(r["loss"], 4) for r in runs if r["system"] == s and r["ok"]})
              for s in meta["systems"]}  # fmt: skip
    lines += ["", f"- last epoch's mean training loss on rank 0 per system: {finals}"]
    lines += [f"- FAILED {r['system']} rep {r['rep']}: {r['error'][-300:]!r}"
              for r in runs if not r["ok"]]  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def run_all(args: argparse.Namespace) -> None:
    systems = [s for s in args.systems.split(",") if s]
    meta: Record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "versions": versions(),
        "lightning": package_version("lightning"),
        "rows": args.rows,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "reps": args.reps,
        "systems": systems,
    }
    logs = Path(tempfile.mkdtemp(prefix="phxbl-logs-"))
    runs: list[Record] = []
    try:
        for rep in range(args.reps):
            for system in systems:
                rec = launch(system, rep, args, logs)
                runs.append(rec)
                keys = ("fit_s", "setup_s", "loop_s", "step_med_ms", "e2e_s")
                summary = " ".join(f"{k}={rec[k]:.2f}" for k in keys if k in rec)
                print(f"[rep {rep}] {system:9} {'ok' if rec['ok'] else 'FAILED'} {summary}",
                      flush=True)  # fmt: skip
                if not rec["ok"]:
                    print(rec["error"][-1500:], flush=True)
    finally:
        meta["machine"]["load_end"] = os.getloadavg()[0]
        write_report(runs, meta, Path(args.out))
        shutil.rmtree(logs, ignore_errors=True)
    print(Path(args.out).with_suffix(".md").read_text())


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rows", type=int, default=16_384)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "lightning_ddp"))
    p.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--json-out", help=argparse.SUPPRESS)
    p.add_argument("--work-dir", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.one:
        for key, value in THREAD_ENV.items():
            os.environ.setdefault(key, value)
        rec = run_one(args)
        if rec is not None:  # rank 1 of Lightning's launcher writes nothing
            Path(args.json_out).write_text(json.dumps(rec))
    else:
        run_all(args)


if __name__ == "__main__":
    main()

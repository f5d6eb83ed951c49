#!/usr/bin/env python
"""B5 recovery: kill -9 rank 1 mid-run; phalanx vs Ray Train 2.60 vs torchrun, side by side.

Run from the repository root:

    python bench/recovery.py                             # 20k rows, 2 epochs, 3 reps
    python bench/recovery.py --reps 5 --systems phalanx,torchrun

Workload: the B2 loop (MLP 784-512-512-10, DDP over gloo, 2 workers, batch 128 per worker, SGD
with momentum) on synthetic rows, shrunk to 20k rows x 2 epochs (158 steps per worker) so that
one run stays short. Every ``--ckpt-every`` steps every rank reports, rank 0 with a checkpoint
of the model and optimizer state; on restart every rank loads the latest checkpoint and skips to
its step (Ray Train and torchrun; phalanx's prepared loader continues at the checkpoint's
data position by itself). On the first attempt only, rank 1 writes ``time.time()`` to a file after step
``--kill-step`` and SIGKILLs itself. Each system gets one retry:

- phalanx: ``phalanx.torch.TorchTrainer`` + ``FailureConfig(max_failures=1)``; first attempt:
  ``get_context().get_attempt() == 0``. Two variants: ``phalanx`` (default ``TorchConfig``: with
  ``max_failures=1`` the fork server imports ``torch._dynamo`` while the first workers run, so
  restarted workers do not import it again in ``prepare_model``) and ``phalanx-nopreload`` (a
  ``TorchConfig`` whose ``preload_modules`` is empty: restarted workers import it, as Ray Train's
  and torchrun's do; what a run with ``max_failures=0`` gets after a preemption).
- raytrain: ``ray.train.torch.TorchTrainer`` + ``ray.train.FailureConfig(max_failures=1)``;
  first attempt: ``ray.train.get_checkpoint() is None``. Ray's default settings (Train V2).
- torchrun: ``python -m torch.distributed.run --nproc-per-node=2 --max-restarts=1
  --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT``; first attempt:
  ``TORCHELASTIC_RESTART_COUNT == "0"``; checkpoints are ``torch.save`` + ``os.replace`` in a
  directory. The workers build their own store (a ``PrefixStore`` per restart on the agent's
  ``TCPStore``): with a plain ``init_process_group("gloo")`` the restarted ranks read the dead
  group's gloo addresses from the agent's store, which outlives restarts, and fail.

Measured (wall clock ``time.time()``, one machine):

- ``detect_s``: kill to the system noticing. phalanx: ``Callback.after_exception`` (fires after
  the failed group was torn down); Ray Train: ``UserCallback.after_exception`` (fires in the
  controller when its poll finds the error, before teardown); torchrun: the agent's
  ``Worker group FAILED ... will restart`` log line (after teardown; LOGLEVEL=INFO).
- ``restart_s``: kill to the first line of the training function on the restarted rank 0.
- ``restore_s``: kill to the first optimizer step completed on the restarted rank 0;
  ``load_s`` is the part spent in loading the checkpoint (``get_checkpoint``/``torch.load``).
- ``fit_total_s``: the trainer's ``fit()`` (torchrun: the ``torchrun`` command, which also pays
  Python start-up and ``import torch`` for its agent and 2x2 workers).

Every run is a fresh subprocess (bench/harness.py: interleaved reps), with
OMP_NUM_THREADS=MKL_NUM_THREADS=1 and torch.set_num_threads(1) in every worker; the driver of
every run imports torch first, as a user's script would. Each run is its own session; after it
exits, the processes left in that session are counted and killed. Results go to
bench/results/recovery.{md,json}. Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness
from common import machine, median, versions
from harness import Record

SYSTEMS = ("phalanx", "phalanx-nopreload", "phalanx-peer", "phalanx-state", "raytrain", "torchrun")
STATE_SYSTEMS = ("phalanx-peer", "phalanx-state")  # save_state loops (issue 44)
WORLD_SIZE = 2
STATE_FILE = "state.pt"
# report(metrics, directory holding STATE_FILE or None)
ReportFn = Callable[[dict[str, Any], str | None], None]


# --------------------------------------------------------------------------- worker side


def _write_json(path: Path, data: Record) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _prepare(system: str, model: Any, loader: Any, rank: int) -> tuple[Any, Any]:
    if system.startswith("phalanx"):
        from phalanx.torch import prepare_data_loader, prepare_model

        return prepare_model(model), prepare_data_loader(loader)
    if system == "raytrain":
        from ray.train.torch import prepare_data_loader, prepare_model

        return prepare_model(model), prepare_data_loader(loader)
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(loader.dataset, num_replicas=WORLD_SIZE, rank=rank, shuffle=True)
    loader = DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler)
    return DistributedDataParallel(model), loader


def _train(
    cfg: dict[str, Any],
    rank: int,
    first_attempt: bool,
    load: Callable[[], Any],
    report: ReportFn,
) -> None:
    """The B2 loop with checkpoints; rank 0 writes its timings to cfg['out_dir']."""
    marks: Record = {"t_first_line": time.time()}
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(cfg["threads"])
    out = Path(cfg["out_dir"])
    mark_file = out / f"rank{rank}-{'fresh' if first_attempt else 'restored'}.json"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg["rows"], 784, generator=g)
    y = (x @ torch.randn(784, 10, generator=g)).argmax(dim=1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    loader = DataLoader(TensorDataset(x, y), batch_size=cfg["batch_size"], shuffle=True)
    marks["t_data"] = time.time()
    model, loader = _prepare(cfg["system"], model, loader, rank)
    marks["t_prepared"] = time.time()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    marks["t_load_start"] = time.time()
    state = load()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    extra = _extra_state(cfg, state)
    marks.update(t_loaded=time.time(), start_step=step, torch_threads=torch.get_num_threads(),
                 omp=os.environ.get("OMP_NUM_THREADS"))  # fmt: skip
    # The full epoch's batches per rank (a resumed phalanx loader's len() is the epoch's rest)
    steps_per_epoch = -(-cfg["rows"] // WORLD_SIZE // cfg["batch_size"])
    # Ray Train's and torchrun's loaders start each epoch over: the loop skips to its step.
    # phalanx's prepared loader continues at the checkpoint's data position by itself; skipping
    # there too would skip the epoch's rest (with --epochs 1: no batch left).
    resumes = cfg["system"].startswith("phalanx")
    loss = torch.zeros(())
    for epoch in range(step // steps_per_epoch, cfg["epochs"]):
        loader.sampler.set_epoch(epoch)
        skip = 0 if resumes else step - epoch * steps_per_epoch
        for xb, yb in itertools.islice(loader, skip, None):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            step += 1
            if "t_first_step" not in marks:
                marks["t_first_step"] = time.time()
                if rank == 0:
                    _write_json(mark_file, marks)
            if rank == 1 and first_attempt and step == cfg["kill_step"]:
                _write_json(out / "kill.json", {"t_kill": time.time(), "step": step})
                os.kill(os.getpid(), signal.SIGKILL)
            if step % cfg["ckpt_every"] == 0:
                _save_and_report(rank, step, model, optimizer, loss.item(), report, extra)
    if rank == 0:
        marks.update(t_done=time.time(), end_step=step, final_loss=loss.item())
        _write_json(mark_file, marks)


def _extra_state(cfg: dict[str, Any], state: Any) -> Any:
    """--raytrain-state: the save_state systems' --state-mb of extra float32 state, kept in
    Ray Train's checkpoints too (None otherwise), restored from ``state`` if given."""
    import torch

    if not (cfg.get("raytrain_state") and cfg["system"] == "raytrain"):
        return None
    if state is not None:
        return state["extra"]
    return torch.zeros(cfg["state_mb"] * (1 << 20) // 4)


def _save_and_report(
    rank: int, step: int, model: Any, optimizer: Any, loss: float, report: ReportFn, extra: Any
) -> None:
    import torch

    metrics = {"step": step, "loss": loss}
    if rank != 0:
        report(metrics, None)
        return
    with tempfile.TemporaryDirectory(prefix="phxb5-ckpt-") as d:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        if extra is not None:
            state["extra"] = extra
        torch.save(state, os.path.join(d, STATE_FILE))
        report(metrics, d)


def _load_from(checkpoint: Any) -> Any:
    """Load STATE_FILE from a phalanx or Ray Train checkpoint (same API), or None."""
    import torch

    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        return torch.load(os.path.join(d, STATE_FILE), weights_only=False)


def _train_state(cfg: dict[str, Any], rank: int, first_attempt: bool) -> None:
    """The B2 loop kept through save_state/load_state (issue 44), with ``state_mb`` MB of
    extra float32 state (a stand-in for a larger model's weights and moments): every rank
    reports every step, with a save_state checkpoint every ``ckpt_every`` steps; the loader is
    prepared after get_checkpoint(), so it follows a recovery to the failed step."""
    marks: Record = {"t_first_line": time.time()}
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import phalanx
    from phalanx.torch import load_state, prepare_data_loader, prepare_model, save_state

    torch.set_num_threads(cfg["threads"])
    out = Path(cfg["out_dir"])
    mark_file = out / f"rank{rank}-{'fresh' if first_attempt else 'restored'}.json"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg["rows"], 784, generator=g)
    y = (x @ torch.randn(784, 10, generator=g)).argmax(dim=1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    marks["t_data"] = time.time()
    model = prepare_model(model)
    marks["t_prepared"] = time.time()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    extra = torch.zeros(cfg["state_mb"] * (1 << 20) // 4)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "extra": extra,
                             "step": 0, "epoch": 0}  # fmt: skip
    marks["t_load_start"] = time.time()
    checkpoint = phalanx.get_checkpoint()
    if checkpoint is not None:
        load_state(checkpoint, state)
    from phalanx.torch import _peer

    marks.update(t_loaded=time.time(), start_step=state["step"],
                 restored_from=type(checkpoint).__name__ if checkpoint else None,
                 hand_over_bytes=_peer.last_hand_over.bytes,
                 hand_over_s=_peer.last_hand_over.seconds,
                 hand_over_transport=_peer.last_hand_over.transport)  # fmt: skip
    loader = prepare_data_loader(
        DataLoader(TensorDataset(x, y), batch_size=cfg["batch_size"], shuffle=True)
    )
    loss = torch.zeros(())
    for epoch in range(state["epoch"], cfg["epochs"]):
        loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            state["step"] += 1
            state["epoch"] = epoch
            step = state["step"]
            if "t_first_step" not in marks:
                marks["t_first_step"] = time.time()
                if rank == 0:
                    _write_json(mark_file, marks)
            if rank == 1 and first_attempt and step == cfg["kill_step"]:
                _write_json(out / "kill.json", {"t_kill": time.time(), "step": step})
                os.kill(os.getpid(), signal.SIGKILL)
            saved = save_state(state) if step % cfg["ckpt_every"] == 0 else None
            phalanx.report({"step": step, "loss": loss.item()}, checkpoint=saved)
    if rank == 0:
        marks.update(t_done=time.time(), end_step=state["step"], final_loss=loss.item())
        _write_json(mark_file, marks)


def _phalanx_fn(cfg: dict[str, Any]) -> None:
    import phalanx

    ctx = phalanx.get_context()
    if cfg["system"] in STATE_SYSTEMS:
        _train_state(cfg, ctx.get_world_rank(), ctx.get_attempt() == 0)
        return

    def report(metrics: dict[str, Any], directory: str | None) -> None:
        ckpt = phalanx.Checkpoint.from_directory(directory) if directory else None
        phalanx.report(metrics, checkpoint=ckpt)

    first = ctx.get_attempt() == 0
    _train(cfg, ctx.get_world_rank(), first, lambda: _load_from(phalanx.get_checkpoint()), report)


def _raytrain_fn(cfg: dict[str, Any]) -> None:
    import ray.train

    def report(metrics: dict[str, Any], directory: str | None) -> None:
        ckpt = ray.train.Checkpoint.from_directory(directory) if directory else None
        ray.train.report(metrics, checkpoint=ckpt)

    rank = ray.train.get_context().get_world_rank()
    first = ray.train.get_checkpoint() is None
    _train(cfg, rank, first, lambda: _load_from(ray.train.get_checkpoint()), report)


def _torchrun_worker(cfg_path: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cfg = json.loads(Path(cfg_path).read_text())
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # The agent's store outlives restarts: a per-restart prefix keeps the dead group's keys away.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD_SIZE,
                          is_master=False, timeout=timedelta(seconds=120))  # fmt: skip
    dist.init_process_group("gloo", store=dist.PrefixStore(f"restart{restart}/", store),
                            rank=rank, world_size=WORLD_SIZE)  # fmt: skip
    latest = Path(cfg["ckpt_dir"]) / STATE_FILE

    def load() -> Any:
        return torch.load(latest, weights_only=False) if latest.exists() else None

    def report(metrics: dict[str, Any], directory: str | None) -> None:
        if directory:
            os.replace(os.path.join(directory, STATE_FILE), latest)

    _train(cfg, rank, restart == 0, load, report)
    dist.destroy_process_group()


# --------------------------------------------------------------------------- one run (driver)


def _write_first_time(path: str) -> None:
    if not os.path.exists(path):
        _write_json(Path(path), {"t_detect": time.time()})


def _fit_phalanx(cfg: dict[str, Any], tmp: Path, preload: bool) -> Record:
    import phalanx
    from phalanx.torch import TorchConfig, TorchTrainer

    class DetectCallback(phalanx.Callback):
        def after_exception(self, run_context: Any, worker_exceptions: Any) -> None:
            _write_first_time(cfg["detect_file"])

    class NoPreloadTorchConfig(TorchConfig):
        @property
        def preload_modules(self) -> tuple[str, ...]:
            return ()

    torch_config = TorchConfig() if preload else NoPreloadTorchConfig()
    trainer = TorchTrainer(
        _phalanx_fn,
        train_loop_config=cfg,
        torch_config=torch_config,
        scaling_config=phalanx.ScalingConfig(num_workers=WORLD_SIZE),
        run_config=phalanx.RunConfig(
            name="b5",
            storage_path=str(tmp / "store"),
            failure_config=phalanx.FailureConfig(max_failures=1),
            callbacks=[DetectCallback()],
        ),
    )
    t0 = time.time()
    result = trainer.fit()
    t_end = time.time()
    return {
        "t_fit": t0,
        "t_end": t_end,
        "error": repr(result.error) if result.error else None,
        "preload_modules": list(torch_config.preload_modules),
    }


def _fit_raytrain(cfg: dict[str, Any], tmp: Path) -> Record:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig, UserCallback
    from ray.train.torch import TorchTrainer

    detect_file = cfg["detect_file"]

    class DetectCallback(UserCallback):
        def after_exception(self, run_context: Any, worker_exceptions: Any) -> None:
            if not os.path.exists(detect_file):
                Path(detect_file).write_text(json.dumps({"t_detect": time.time()}))

    t0 = time.perf_counter()
    # address="local": a private cluster, even if another Ray instance runs on this machine.
    ray.init(address="local", num_cpus=WORLD_SIZE, include_dashboard=False)
    init_s = time.perf_counter() - t0
    try:
        trainer = TorchTrainer(
            _raytrain_fn,
            train_loop_config=cfg,
            scaling_config=ScalingConfig(num_workers=WORLD_SIZE),
            run_config=RunConfig(
                name="b5",
                storage_path=str(tmp / "store"),
                failure_config=FailureConfig(max_failures=1),
                callbacks=[DetectCallback()],
            ),
        )
        t_fit = time.time()
        result = trainer.fit()
        t_end = time.time()
    finally:
        ray.shutdown()
    return {"t_fit": t_fit, "t_end": t_end, "ray_init_s": init_s,
            "error": repr(result.error) if result.error else None}  # fmt: skip


GLOG_TIME = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) ")


def _glog_time(line: str, year: int) -> float | None:
    """Epoch seconds of a torch.distributed.elastic log line (glog style, local time)."""
    m = GLOG_TIME.match(line)
    if not m:
        return None
    month, day, hour, minute = (int(v) for v in m.groups()[:4])
    sec = float(m.group(5))
    t = time.mktime((year, month, day, hour, minute, int(sec), 0, 0, -1))
    return t + sec - int(sec)


def _fit_torchrun(cfg: dict[str, Any], tmp: Path) -> Record:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg["ckpt_dir"] = str(tmp / "ckpt")
    Path(cfg["ckpt_dir"]).mkdir()
    cfg_path = tmp / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
           str(Path(__file__).resolve()), "--torchrun-worker", str(cfg_path)]  # fmt: skip
    log = tmp / "torchrun.log"
    t0 = time.time()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, env=dict(os.environ, LOGLEVEL="INFO"), stdout=fh,
                            stderr=subprocess.STDOUT, check=False).returncode  # fmt: skip
    t_end = time.time()
    year = datetime.now().year
    for line in log.read_text(errors="replace").splitlines():
        if "Worker group FAILED" in line and "will restart" in line:
            t = _glog_time(line, year)
            if t is not None:
                _write_json(Path(cfg["detect_file"]), {"t_detect": t})
            break
    return {"t_fit": t0, "t_end": t_end,
            "error": None if rc == 0 else f"torchrun rc={rc}: {log.read_text()[-1500:]}"}  # fmt: skip


def _read(path: Path) -> Record:
    return json.loads(path.read_text()) if path.exists() else {}


def _derive(rec: Record, out: Path) -> Record:
    kill, detect = _read(out / "kill.json"), _read(out / "detect.json")
    fresh, restored = _read(out / "rank0-fresh.json"), _read(out / "rank0-restored.json")
    rec.update(kill=kill, fresh=fresh, restored=restored)
    t_kill = kill.get("t_kill")
    if t_kill is None:
        return rec
    if "t_detect" in detect:
        rec["detect_s"] = detect["t_detect"] - t_kill
    if "t_first_line" in restored:
        rec["restart_s"] = restored["t_first_line"] - t_kill
    if "t_first_step" in restored:
        rec["restore_s"] = restored["t_first_step"] - t_kill
        rec["setup_s"] = restored["t_first_step"] - restored["t_first_line"]
        rec["data_s"] = restored["t_data"] - restored["t_first_line"]
        rec["prepare_s"] = restored["t_prepared"] - restored["t_data"]
        rec["load_s"] = restored["t_loaded"] - restored["t_load_start"]
        rec["step1_s"] = restored["t_first_step"] - restored["t_loaded"]
        rec["resumed_from_step"] = restored["start_step"]
        rec["steps_redone"] = kill.get("step", 0) - restored["start_step"]
        rec["restored_from"] = restored.get("restored_from")
    if restored.get("hand_over_bytes"):
        rec["hand_over_gb"] = restored["hand_over_bytes"] / 1e9
        rec["hand_over_gbps"] = restored["hand_over_bytes"] / 1e9 / restored["hand_over_s"]
    return rec


def run_one(args: argparse.Namespace) -> Record:
    t0 = time.perf_counter()
    import torch  # what every driver script imports first

    torch.set_num_threads(1)
    import_s = time.perf_counter() - t0
    tmp = Path(args.work_dir)  # the harness removes it after the run
    out = tmp / "marks"
    out.mkdir()
    cfg = {
        "system": args.one,
        "rows": args.rows,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "ckpt_every": args.ckpt_every,
        "kill_step": args.kill_step,
        "state_mb": args.state_mb,
        "raytrain_state": args.raytrain_state,
        "threads": 1,
        "out_dir": str(out),
        "detect_file": str(out / "detect.json"),
    }
    if args.one == "raytrain":
        rec = _fit_raytrain(cfg, tmp)
    elif args.one == "torchrun":
        rec = _fit_torchrun(cfg, tmp)
    else:
        if args.one == "phalanx-state":  # today's restore: from the save_state checkpoint
            os.environ["PHALANX_PEER_RECOVERY"] = "0"
        rec = _fit_phalanx(cfg, tmp, preload=args.one != "phalanx-nopreload")
    rec = _derive(rec, out)
    rec.update(import_s=import_s, fit_total_s=rec["t_end"] - rec["t_fit"])
    return rec


# --------------------------------------------------------------------------- report

COLUMNS = [
    ("detect_s", "detect_s"),
    ("restart_s", "kill → first line"),
    ("restore_s", "restore_s"),
    ("fit_total_s", "fit_total_s"),
    ("e2e_s", "whole process"),
]
# Where the restarted rank 0 spends "first line → first step".
BREAKDOWN = [
    ("setup_s", "first line → first step"),
    ("data_s", "data + model"),
    ("prepare_s", "prepare_model/loader (DDP)"),
    ("load_s", "load ckpt"),
    ("step1_s", "skip to step + first step"),
]
# Recovery to the failed step (issue 44): peer vs the save_state checkpoint.
PEER = [
    ("steps_redone", "steps trained again"),
    ("hand_over_gb", "hand-over GB (rank 0 sent)"),
    ("hand_over_gbps", "hand-over GB/s"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128, help="per worker")
    p.add_argument("--ckpt-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--kill-step", type=int, default=50, help="rank 1 dies after this step")
    p.add_argument(
        "--state-mb", type=int, default=256, help="extra state of the save_state systems (MB)"
    )
    p.add_argument(
        "--raytrain-state",
        action="store_true",
        help="Ray Train's loop keeps --state-mb of extra state in its checkpoints too",
    )
    p.add_argument("--torchrun-worker", help=argparse.SUPPRESS)
    p.add_argument("--trials", type=int, default=0, help="issue 44 trials mode: N seeded kills")
    p.add_argument("--trial-seed", type=int, default=0)
    p.add_argument("--trial-engines", default="local,ray")
    p.add_argument("--trial-workers", default="2,3", help="world sizes, e.g. 2,3")
    p.add_argument("--trial-data", default="loader", help="loader, dataset (phalanx.data) or both")


def workload(meta: Record) -> list[str]:
    steps = -(-meta["rows"] // WORLD_SIZE // meta["batch_size"]) * meta["epochs"]
    return [
        f"- workload (B2 loop, shrunk): MLP 784-512-512-10, {meta['rows']:,} synthetic rows, "
        f"{WORLD_SIZE} workers (gloo DDP), {meta['epochs']} epochs = {steps} steps per worker, "
        f"batch {meta['batch_size']} per worker; every {meta['ckpt_every']} steps all ranks "
        "report, rank 0 with a checkpoint (model + optimizer, ~10 MB); rank 1 SIGKILLs itself "
        f"after step {meta['kill_step']} of the first attempt; max_failures=1; 1 thread per "
        "worker everywhere",
        "- detect_s: kill → phalanx `Callback.after_exception` (after teardown) / Ray "
        "`UserCallback.after_exception` (before teardown) / torchrun agent log line "
        "`Worker group FAILED ... will restart` (after teardown). restore_s: kill → first "
        "optimizer step done by the restarted rank 0 (includes load ckpt and the skip to the "
        "checkpoint's step). fit_total_s: fit() (torchrun: the whole torchrun command). Seconds.",
        f"- phalanx-peer / phalanx-state: the same loop kept through save_state/load_state with "
        f"{meta['state_mb']} MB of extra float32 state, every rank reporting every step, a "
        f"save_state checkpoint every {meta['ckpt_every']} steps; phalanx-peer resumes from the "
        "survivors' state (issue 44), phalanx-state from the checkpoint "
        "(PHALANX_PEER_RECOVERY=0)."
        + (
            f" raytrain (--raytrain-state): its checkpoints hold the same {meta['state_mb']} MB "
            "too (torch.save by rank 0)."
            if meta.get("raytrain_state")
            else ""
        ),
    ]


def report(runs: list[Record], meta: Record) -> list[str]:
    systems = meta["systems"]
    lines = harness.table(runs, systems, COLUMNS, digits=3)
    lines += ["", "Restarted rank 0, first line of the training fn → first step:", ""]
    lines += harness.table(runs, systems, BREAKDOWN, digits=3)
    state_systems = [s for s in systems if s in STATE_SYSTEMS]
    if state_systems:
        lines += ["", "save_state loops: recovery to the failed step (peer) vs the checkpoint:", ""]
        lines += harness.table(runs, state_systems, PEER, digits=3)
    wanted = [(a, b) for a in ("phalanx", "phalanx-nopreload") for b in ("raytrain", "torchrun")]
    wanted += [("phalanx-peer", "phalanx-state"), ("phalanx-peer", "raytrain")]
    pairs = harness.pairs_of(systems, [*wanted, ("phalanx", "phalanx-nopreload")])
    lines += ["", *harness.ratio_table(runs, pairs, COLUMNS)]
    return [*lines, "", *_targets(runs, systems), *_notes(runs, systems)]


def _targets(runs: list[Record], systems: list[str]) -> list[str]:
    """B5: detection <= 0.2 s; back to training <= 1.5 s + load; <= 0.1x Ray Train."""
    lines = []
    for s in (s for s in systems if s.startswith("phalanx")):
        detect = median(list(harness.vals(runs, s, "detect_s").values()))
        back = [r["restore_s"] - r["load_s"] for r in runs if r["system"] == s and r["ok"]]
        if detect is None or not back:
            continue
        lines.append(
            f"- B5 targets, {s}: detection {detect:.3f} s (target <= 0.2); kill → first step "
            f"minus checkpoint load {statistics.median(back):.3f} s (target <= 1.5); "
            f"restore_s / raytrain {harness.ratio(runs, 'restore_s', s, 'raytrain')}, detect_s / "
            f"raytrain {harness.ratio(runs, 'detect_s', s, 'raytrain')} (target <= 0.1x)"
        )
    return lines


def _notes(runs: list[Record], systems: list[str]) -> list[str]:
    notes = []
    for s in systems:
        mine = [r for r in runs if r["system"] == s and r["ok"]]
        resumed = sorted({r.get("resumed_from_step") for r in mine}, key=str)
        losses = sorted({round(r["restored"].get("final_loss", float("nan")), 4) for r in mine})
        left = sorted(
            {n.split(" ", 1)[-1] for r in runs if r["system"] == s for n in r["leftover"]}
        )
        count = sum(len(r["leftover"]) for r in runs if r["system"] == s)
        notes.append(f"- {s}: resumed from step {resumed}; final loss {losses}; processes of the "
                     f"run still alive 1 s after its driver exited (then killed): {count} "
                     f"{left or ''}")  # fmt: skip
    notes += [
        "- torchrun: the workers join gloo through a `PrefixStore` per restart on the agent's "
        'store; with a plain `init_process_group("gloo")` the restarted ranks read the dead '
        "group's gloo addresses from the agent's store (it outlives restarts) and fail with "
        "`Gloo connectFullMesh failed ... Connection refused`.",
        "- `prepare_model` (DDP construction) imports `torch._dynamo` on first use in a "
        "process: in workers restarted from phalanx's fork server without a preload "
        "(`phalanx-nopreload`), in every new Ray Train and torchrun worker. `phalanx` (the "
        "default `TorchConfig`, `max_failures=1`) has the fork server import it while the first "
        "workers run.",
    ]
    return notes


BENCH = harness.Bench(
    name="recovery",
    title="B5 recovery: kill -9 of rank 1 mid-run, phalanx vs Ray Train vs torchrun",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=(
        "detect_s",
        "restart_s",
        "restore_s",
        "prepare_s",
        "step1_s",
        "fit_total_s",
        "e2e_s",
    ),
    ok=lambda rec: rec.get("error") is None and "restore_s" in rec,
    timeout_s=600.0,
    own_session=True,
    digits=3,
)


# --------------------------------------------------------------------------- trials (issue 44)

TRIAL_SIZE, TRIAL_BATCH, TRIAL_EPOCHS, TRIAL_EVERY = 48, 4, 3, 5
KILL_POINTS = ("start", "after-step")  # as the rank starts step k / after its step k, unreported


def _trial_loop(config: dict[str, Any]) -> list[float]:
    """A small deterministic DDP loop kept through save_state (a checkpoint every TRIAL_EVERY
    steps, and at step ``save_at``, every rank reports every step); each report appended to
    ``<log>/<rank>`` as "attempt step pid restored-from"; ``kill`` = [rank, step, point]
    SIGKILLs that rank in attempt 0. ``dataset``: the samples come from a phalanx dataset of
    sample ids (``get_dataset_shard``), each line also holds the step's epoch and ids."""
    import torch
    from torch.utils.data import TensorDataset

    import phalanx
    from phalanx.torch import load_state, prepare_model, save_state

    torch.set_num_threads(1)
    ctx = phalanx.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    torch.manual_seed(0)
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state: dict[str, Any] = {"model": model, "opt": opt, "step": 0, "epoch": 0}
    checkpoint = phalanx.get_checkpoint()  # before prepare_data_loader: the loader follows it
    if checkpoint is not None:
        load_state(checkpoint, state)
    kind = type(checkpoint).__name__ if checkpoint is not None else "none"
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(
        torch.randn(TRIAL_SIZE, 8, generator=g), torch.randn(TRIAL_SIZE, 1, generator=g)
    )
    loader = _trial_data(config, data)
    kill = config.get("kill") or [None, None, None]
    log = open(os.path.join(config["log"], str(rank)), "a", buffering=1)
    start = ctx.get_data_position("train").epoch if config.get("dataset") else state["epoch"]
    for epoch in range(start, TRIAL_EPOCHS):
        for x, y, ids in loader(epoch):
            here = attempt == 0 and rank == kill[0] and state["step"] + 1 == kill[1]
            if here and kill[2] == "start":
                os.kill(os.getpid(), signal.SIGKILL)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if here:  # after-step: the step is done on every rank, this rank never reports it
                os.kill(os.getpid(), signal.SIGKILL)
            state["step"] += 1
            state["epoch"] = epoch
            log.write(f"{attempt} {state['step']} {os.getpid()} {kind} {epoch} {ids}\n")
            save = state["step"] % TRIAL_EVERY == 0 or state["step"] == config.get("save_at")
            phalanx.report(
                {"step": state["step"]},
                checkpoint=save_state(state, blocking=True) if save else None,
            )
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def _trial_data(config: dict[str, Any], data: Any) -> Callable[[int], Any]:
    """Epoch -> its batches (x, y, sample ids) on this rank: from a prepared DataLoader, or
    from the phalanx dataset of sample ids (``config["dataset"]``), which indexes ``data``."""
    from torch.utils.data import DataLoader

    import phalanx
    from phalanx.torch import prepare_data_loader

    if not config.get("dataset"):
        loader = prepare_data_loader(DataLoader(data, batch_size=TRIAL_BATCH, shuffle=True))

        def batches(epoch: int) -> Any:
            loader.sampler.set_epoch(epoch)
            return ((x, y, "-") for x, y in loader)

        return batches
    shard = phalanx.get_dataset_shard("train")

    def rows(epoch: int) -> Any:
        for batch in shard.iter_batches(batch_size=TRIAL_BATCH):
            ids = [int(i) for i in batch["id"]]
            yield data.tensors[0][ids], data.tensors[1][ids], ",".join(map(str, ids))

    return rows


def _trial_fit(
    engine: str,
    workers: int,
    tmp: Path,
    name: str,
    kill: list[Any] | None,
    save_at: int = 0,
    dataset: bool = False,
) -> Record:
    import phalanx
    from phalanx.torch import TorchTrainer

    log = tmp / f"{name}-log"
    log.mkdir()
    started = time.perf_counter()
    result = TorchTrainer(
        _trial_loop,
        train_loop_config={"log": str(log), "kill": kill, "save_at": save_at, "dataset": dataset},
        datasets={"train": {"id": list(range(TRIAL_SIZE))}} if dataset else None,
        scaling_config=phalanx.ScalingConfig(num_workers=workers, engine=engine),
        run_config=phalanx.RunConfig(
            name=name,
            storage_path=str(tmp / "store"),
            failure_config=phalanx.FailureConfig(max_failures=1),
        ),
    ).fit()
    lines = {
        r: [ln.split() for ln in (log / str(r)).read_text().splitlines()] for r in range(workers)
    }
    frame = result.metrics_dataframe
    return {
        "fit_s": time.perf_counter() - started,
        "error": repr(result.error) if result.error else None,
        "attempts": result.attempts,
        "weights": result.return_value,
        "rows": [int(v) for v in frame["step"]],
        "iterations": [int(v) for v in frame["training_iteration"]],
        "lines": lines,
    }


def _restart_at(engine: str, workers: int, tmp: Path, name: str, step: int) -> Record:
    """The reference of a trial with 3 or more ranks: a run restarted at ``step`` from the same
    state (a checkpoint of step - 1, rank 1 killed as it starts ``step``, every worker replaced:
    ``PHALANX_RESTORE_MODE=full``, read by the driver)."""
    os.environ["PHALANX_RESTORE_MODE"] = "full"
    try:
        return _trial_fit(engine, workers, tmp, name, [1, step, "start"], save_at=step - 1)
    finally:
        del os.environ["PHALANX_RESTORE_MODE"]


def _judge(trial: Record, reference: Record, workers: int) -> Record:
    """What a trial must show: one retry, every rank restored from its peers, at most the failed
    step trained again, one metrics row per step, and the weights, bitwise, of a run that never
    failed (2 ranks) or of a restart at the same step from the same state (``restart``: 3 or
    more, where a re-created DDP's bucket order changes the allreduce's rounding)."""
    lines, total = trial["lines"], len(reference["rows"])
    before = {r: [int(ln[1]) for ln in lines[r] if ln[0] == "0"] for r in range(workers)}
    after = {r: [ln for ln in lines[r] if ln[0] == "1"] for r in range(workers)}
    killed = trial["kill"][0]  # the survivors' last step: every rank completed it
    completed = max(max(before[r], default=0) for r in range(workers) if r != killed)
    first = min((int(a[0][1]) for a in after.values() if a), default=None)
    checks = {
        "finished": trial["error"] is None and trial["attempts"] == 2,
        "from_peers": all({ln[3] for ln in a} == {"PeerCheckpoint"} for a in after.values()),
        "steps_redone_le_1": first is not None and first >= completed,
        "rows_once_each": trial["rows"] == list(range(1, total + 1))
        and trial["iterations"] == trial["rows"],
        "bitwise": trial["weights"] == reference["weights"],
    }
    if workers > 2:  # a re-created DDP's bucket order changes the rounding (issue 44)
        restart = trial.get("restart")
        checks["bitwise"] = restart is not None and trial["weights"] == restart["weights"]
    if trial.get("dataset"):  # the rest of the epoch is split anew: not an unbroken run's steps
        del checks["bitwise"]
        kept = [(ln[4], int(i)) for r in range(workers) for ln in lines[r]
                if ln[0] == "1" or (first is not None and int(ln[1]) < first)
                for i in ln[5].split(",")]  # fmt: skip
        checks["every_sample_once"] = all(
            sorted(i for e, i in kept if e == str(epoch)) == list(range(TRIAL_SIZE))
            for epoch in range(TRIAL_EPOCHS)
        )
    return {
        "steps_redone": (completed - first + 1) if first is not None else None,  # 0: none
        "resumed_at": first,
        "checks": checks,
        "passed": all(checks.values()),
    }


def run_trials(args: argparse.Namespace) -> None:
    """--trials N: per engine, N fits with a seeded random kill (rank, step, point), each judged
    by ``_judge``; results in bench/results/recovery_trials.{md,json}."""
    import random

    import torch

    torch.set_num_threads(1)
    sizes = [int(w) for w in str(args.trial_workers).split(",")]
    rng = random.Random(args.trial_seed)
    kills = {w: [[rng.randrange(w), rng.randint(TRIAL_EVERY + 1, _steps(w) - 1), rng.choice(KILL_POINTS)]
                 for _ in range(args.trials)] for w in sizes}  # fmt: skip
    meta: Record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "versions": versions(),
        "workers": sizes,
        "steps": {w: _steps(w) for w in sizes},
        "seed": args.trial_seed,
        "data": args.trial_data,
    }
    trials: list[Record] = []
    for engine in args.trial_engines.split(","):
        if engine == "ray":
            import ray

            ray.init(address="local", num_cpus=max(sizes) + 1, include_dashboard=False,
                     log_to_driver=False)  # fmt: skip
        try:
            for data in args.trial_data.split(","):
                for workers in sizes:
                    trials += _trials_of(engine, workers, kills[workers], data == "dataset")
        finally:
            if engine == "ray":
                ray.shutdown()
    meta["machine"]["load_end"] = os.getloadavg()[0]
    out = Path(args.out).with_name("recovery_trials")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "trials": trials}, indent=1) + "\n"
    )
    lines = _trials_report(trials, meta)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _steps(workers: int) -> int:
    return -(-TRIAL_SIZE // workers // TRIAL_BATCH) * TRIAL_EPOCHS


def _trials_of(engine: str, workers: int, kills: list[list[Any]], dataset: bool) -> list[Record]:
    trials, data = [], "dataset" if dataset else "loader"
    with tempfile.TemporaryDirectory(prefix=f"phx-trials-{engine}-{workers}-") as d:
        reference = _trial_fit(engine, workers, Path(d), "reference", None, dataset=dataset)
        for i, kill in enumerate(kills):
            fit = {**_trial_fit(engine, workers, Path(d), f"trial{i}", kill, dataset=dataset),
                   "kill": kill, "dataset": dataset}  # fmt: skip
            first = min((int(ln[1]) for r in fit["lines"].values() for ln in r if ln[0] == "1"),
                        default=None)  # fmt: skip
            if workers > 2 and first is not None and not dataset:
                fit["restart"] = _restart_at(engine, workers, Path(d), f"restart{i}", first)
            judged = _judge(fit, reference, workers)
            rec = {"engine": engine, "workers": workers, "data": data, "trial": i, "kill": kill,
                   "fit_s": fit["fit_s"], "error": fit["error"], **judged}  # fmt: skip
            trials.append(rec)
            print(f"{engine} {workers} ranks {data} trial {i}: kill rank {kill[0]} step {kill[1]} "
                  f"({kill[2]}): {'PASS' if rec['passed'] else 'FAIL'} {judged['checks']}",
                  flush=True)  # fmt: skip
    return trials


def _trials_report(trials: list[Record], meta: Record) -> list[str]:
    m, v = meta["machine"], meta["versions"]
    lines = [
        "# Issue 44 trials: recovery to the failed step under seeded random kills",
        "",
        f"- date: {meta['date']}; command: `{meta['command']}`",
        f"- machine: {m['nproc']} CPUs, {m['memory_gib']} GiB, {m['cpu_model']}; load avg "
        f"{m['load_start']:.2f} at start, {m['load_end']:.2f} at end",
        f"- versions: Python {v['python']}, torch {v['torch']}, ray {v['ray']}",
        f"- workload: MLP 8-16-1, DDP over gloo, {meta['workers']} ranks "
        f"({TRIAL_SIZE} samples, batch {TRIAL_BATCH}, {TRIAL_EPOCHS} epochs: steps "
        f"{meta['steps']}), "
        f"save_state checkpoint every {TRIAL_EVERY} steps, every rank reports every step; "
        "each trial SIGKILLs one rank (seeded: rank, step, point 'start' = as it starts the "
        "step, 'after-step' = after its optimizer step, before its report; the step drawn after the "
        "first save_state, which names the state the survivors keep); max_failures=1",
        "- a trial passes when: one retry, every rank restored from a PeerCheckpoint, at most "
        "the failed step trained again, metrics rows 1..N once each (training_iteration = step), "
        "final weights bitwise those of an uninterrupted run (2 ranks) or of a run restarted "
        "at the same step from the same state (3 ranks: a checkpoint there, every worker "
        "replaced; a re-created DDP's buckets change the allreduce's rounding)",
        "- data `dataset`: a phalanx dataset of sample ids (`datasets=`, `get_dataset_shard`) "
        "instead of the DataLoader; bitwise is not asked there (the rest of the epoch is split "
        "anew over the ranks), every sample once per epoch (the steps kept) is",
        "",
        "| engine | ranks | data | passed | steps trained again | failed checks |",
        "|---|---|---|---|---|---|",
    ]
    groups = dict.fromkeys((t["engine"], t["workers"], t.get("data", "loader")) for t in trials)
    for engine, workers, data in groups:
        mine = [t for t in trials
                if (t["engine"], t["workers"], t.get("data", "loader")) == (engine, workers, data)]  # fmt: skip
        passed = sum(t["passed"] for t in mine)
        redone = sorted({t["steps_redone"] for t in mine}, key=str)
        failed = sorted({k for t in mine for k, ok in t["checks"].items() if not ok})
        lines.append(
            f"| {engine} | {workers} | {data} | {passed} of {len(mine)} | {redone} | "
            f"{', '.join(failed) or '-'} |"
        )
    lines += ["", "| engine | ranks | data | trial | kill (rank, step, point) | steps again | fit s | result |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in trials:
        bad = [k for k, ok in t["checks"].items() if not ok]
        lines.append(f"| {t['engine']} | {t['workers']} | {t.get('data', 'loader')} | {t['trial']} | {tuple(t['kill'])} | {t['steps_redone']} | "
                     f"{t['fit_s']:.1f} | {'pass' if t['passed'] else 'FAIL: ' + ', '.join(bad)} |")  # fmt: skip
    return lines


def main() -> None:
    args = harness.parse_args(BENCH)
    if args.torchrun_worker:  # a worker torchrun started (see _fit_torchrun)
        _torchrun_worker(args.torchrun_worker)
    elif args.trials:
        run_trials(args)
    else:
        harness.main(BENCH, args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""B1 startup and B3 report cost: phalanx vs Ray Train 2.60 vs raw torch, side by side.

Run from the repository root:

    python bench/startup.py                                  # everything, 3 reps
    python bench/startup.py --systems raw,raytrain --reps 3  # before phalanx exists
    python bench/startup.py --systems phalanx_ray,raytrain   # phalanx's Ray engine vs Ray Train
    python bench/startup.py --systems phalanx,phalanx_spawn  # fork server vs spawn start path
    python bench/startup.py --workloads noop,ddp --reps 5

Workloads (2 workers each):
  noop    the training fn records the time of its first line and returns.
  ddp     Linear(10, 1) in DDP (gloo), 200 SGD steps, report() every 20 steps (raw: no report).
  report  (B3) 2,000 steps of 1 ms busy work, report() every step, latency of each call
          measured in rank 0. Ray Train gets fewer steps (--ray-report-steps), because its
          report() blocks for seconds. Raw: a plain loop appending the dict to a list.

Every measurement runs in a fresh Python subprocess (this script with ``--one SYSTEM WORKLOAD``),
interleaved A B C A B C ... . Results go to bench/results/startup.{md,json}.
Only the standard library is imported at module level, so that ``import_s`` measures the
heavy imports (torch, ray, phalanx) alone.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import MARKER_ENV, free_port, machine, median, package_version, reap_marked, spin

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("phalanx", "phalanx_spawn", "phalanx_ray", "raytrain", "raw")
WORKLOADS = ("noop", "ddp", "report")
WORLD_SIZE = 2
DDP_STEPS = 200
DDP_REPORT_EVERY = 20
DDP_BATCH = 32
REPORT_STEPS = 2000
BUSY_S = 0.001
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

ReportFn = Callable[[dict[str, Any]], Any]
Record = dict[str, Any]


# --------------------------------------------------------------------------- worker side
# Everything here runs inside training workers (forked, spawned or Ray actors). The functions
# live in __main__, so cloudpickle ships them by value; they touch only stdlib and torch.


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.rename(path)


def _thread_info() -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    return {
        "omp_env": os.environ.get("OMP_NUM_THREADS"),
        "mkl_env": os.environ.get("MKL_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
    }


def _ddp_loop(cfg: dict[str, Any], rank: int, world: int, report: ReportFn | None) -> Record:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    t_setup = time.perf_counter()
    info = _thread_info()
    if cfg["init_pg"]:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(cfg["master_port"])
        dist.init_process_group("gloo", rank=rank, world_size=world)
    pg_s = time.perf_counter() - t_setup
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()
    gen = torch.Generator().manual_seed(rank)
    steps, every = cfg["steps"], cfg["report_every"]
    xs = torch.randn(steps, DDP_BATCH, 10, generator=gen)
    ys = torch.randn(steps, DDP_BATCH, 1, generator=gen)
    t0 = time.perf_counter()
    setup_s = t0 - t_setup
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(xs[step]), ys[step])
        loss.backward()
        opt.step()
        if report is not None and (step + 1) % every == 0:
            report({"step": step, "loss": loss.item()})
    loop_s = time.perf_counter() - t0
    if cfg["init_pg"]:
        dist.destroy_process_group()
    return {"loop_s": loop_s, "init_pg_s": pg_s, "setup_s": setup_s, **info}


def _report_loop(cfg: dict[str, Any], report: ReportFn) -> Record:
    info = _thread_info()
    lat_ns: list[int] = []
    t0 = time.perf_counter()
    for step in range(cfg["steps"]):
        spin(BUSY_S)
        metrics = {"step": step, "loss": 1.0 / (step + 1)}
        t = time.perf_counter_ns()
        report(metrics)
        lat_ns.append(time.perf_counter_ns() - t)
    loop_s = time.perf_counter() - t0
    return {"loop_s": loop_s, "latency": _latency_summary(lat_ns), **info}


def _worker_body(
    cfg: dict[str, Any], t_first: float, rank: int, world: int, report: ReportFn | None
) -> None:
    out = Path(cfg["out_dir"])
    _write_json(out / f"first_line_rank{rank}.json", {"t": t_first, "pid": os.getpid()})
    if cfg["workload"] == "noop":
        return
    if cfg["workload"] == "ddp":
        stats = _ddp_loop(cfg, rank, world, report)
    else:
        assert report is not None
        stats = _report_loop(cfg, report)
    if rank == 0:
        _write_json(out / "rank0.json", {**stats, "t_done": time.time()})


def _phalanx_train_fn(config: dict[str, Any]) -> None:
    t_first = time.time()
    import phalanx as train

    ctx = train.get_context()
    _worker_body(config, t_first, ctx.get_world_rank(), ctx.get_world_size(), train.report)


def _ray_train_fn(config: dict[str, Any]) -> None:
    t_first = time.time()
    import ray.train

    ctx = ray.train.get_context()
    _worker_body(config, t_first, ctx.get_world_rank(), ctx.get_world_size(), ray.train.report)


def _raw_worker(rank: int, config: dict[str, Any]) -> None:
    t_first = time.time()
    _worker_body(config, t_first, rank, config["world_size"], None)


# --------------------------------------------------------------------------- one measurement


def _latency_summary(lat_ns: list[int]) -> Record:
    if not lat_ns:
        return {"n": 0}
    s = sorted(lat_ns)

    def pct(q: float) -> float:
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] / 1e3

    return {
        "n": len(s),
        "p50_us": pct(0.50),
        "p90_us": pct(0.90),
        "p99_us": pct(0.99),
        "max_us": s[-1] / 1e3,
        "mean_us": sum(s) / len(s) / 1e3,
    }


def _import_system(system: str, phalanx_trainer: str, extra: list[str]) -> None:
    """The imports a user's driver script does; timed as import_s."""
    import torch
    import torch.distributed
    import torch.nn.parallel

    torch.set_num_threads(1)
    for name in extra:
        importlib.import_module(name)
    if system == "phalanx_ray":
        import ray

        del ray
    if system in ("phalanx", "phalanx_spawn", "phalanx_ray"):
        import phalanx

        if phalanx_trainer == "torch":
            _phalanx_torch_trainer_cls()
        del phalanx
    elif system == "raytrain":
        import ray
        import ray.train
        import ray.train.torch
        import ray.train.v2.api.data_parallel_trainer

        del ray
    else:
        import torch.multiprocessing


def _phalanx_torch_trainer_cls() -> Any:
    import phalanx

    try:
        import phalanx.torch as phalanx_torch

        return phalanx_torch.TorchTrainer
    except (ImportError, AttributeError):
        return phalanx.TorchTrainer


def _expected_steps(workload: str, steps: int) -> list[int]:
    if workload == "ddp":
        return list(range(DDP_REPORT_EVERY - 1, steps, DDP_REPORT_EVERY))
    return list(range(steps)) if workload == "report" else []


def _check_metrics(df: Any, workload: str, steps: int) -> Record:
    """Did every rank-0 report reach the driver, in order?"""
    if df is None:
        return {"reports_seen": None, "reports_in_order": None}
    got = [int(x) for x in df["step"].tolist()] if "step" in df.columns else []
    return {"reports_seen": len(df), "reports_in_order": got == _expected_steps(workload, steps)}


def _drive_phalanx(
    workload: str, cfg: dict[str, Any], tmp: Path, args: Any, engine: str | None = None
) -> Record:
    import phalanx as train

    common: dict[str, Any] = {
        "train_loop_config": cfg,
        "scaling_config": train.ScalingConfig(num_workers=WORLD_SIZE, engine=engine),
        "run_config": train.RunConfig(name=f"bench-{workload}", storage_path=str(tmp / "store")),
    }
    if workload == "ddp" and args.phalanx_trainer == "torch":
        cfg["init_pg"] = False
        trainer = _phalanx_torch_trainer_cls()(_phalanx_train_fn, **common)
    else:
        trainer = train.DataParallelTrainer(_phalanx_train_fn, **common)
    t_fit = time.time()
    result = trainer.fit()
    t_end = time.time()
    rec: Record = {"t_fit": t_fit, "t_end": t_end, "trainer": type(trainer).__name__}
    rec.update(_check_metrics(getattr(result, "metrics_dataframe", None), workload, cfg["steps"]))
    return rec


def _drive_phalanx_spawn(workload: str, cfg: dict[str, Any], tmp: Path, args: Any) -> Record:
    """phalanx's local engine on its portable path: each worker a new interpreter (macOS, a
    driver that initialised CUDA), forced here with PHALANX_START_METHOD."""
    os.environ["PHALANX_START_METHOD"] = "spawn"
    return _drive_phalanx(workload, cfg, tmp, args)


def _drive_phalanx_ray(workload: str, cfg: dict[str, Any], tmp: Path, args: Any) -> Record:
    """phalanx's Ray engine on a fresh local Ray instance started as Ray Train's run starts it."""
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=WORLD_SIZE, include_dashboard=False)
    init_s = time.perf_counter() - t0
    try:
        rec = _drive_phalanx(workload, cfg, tmp, args, engine="ray")
    finally:
        t1 = time.perf_counter()
        ray.shutdown()
        shutdown_s = time.perf_counter() - t1
    return {**rec, "ray_init_s": init_s, "ray_shutdown_s": shutdown_s}


def _drive_raytrain(workload: str, cfg: dict[str, Any], tmp: Path, args: Any) -> Record:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    t0 = time.perf_counter()
    # address="local": always a fresh cluster, never one that another process started.
    ray.init(address="local", num_cpus=WORLD_SIZE, include_dashboard=False)
    init_s = time.perf_counter() - t0
    try:
        cls = TorchTrainer if workload == "ddp" else DataParallelTrainer
        cfg["init_pg"] = False  # TorchTrainer sets up the gloo process group itself
        trainer = cls(
            _ray_train_fn,
            train_loop_config=cfg,
            scaling_config=ScalingConfig(num_workers=WORLD_SIZE),
            run_config=RunConfig(name=f"bench-{workload}", storage_path=str(tmp / "store")),
        )
        t_fit = time.time()
        result = trainer.fit()
        t_end = time.time()
    finally:
        t1 = time.perf_counter()
        ray.shutdown()
        shutdown_s = time.perf_counter() - t1
    # Ray Train V2 keeps only metrics attached to checkpoints: the in-order check is n/a.
    return {
        "t_fit": t_fit,
        "t_end": t_end,
        "trainer": f"{cls.__module__}.{cls.__name__}",
        "ray_init_s": init_s,
        "ray_shutdown_s": shutdown_s,
        "last_metrics": result.metrics,
    }


def _drive_raw(workload: str, cfg: dict[str, Any], tmp: Path, args: Any) -> Record:
    if workload == "report":  # the cost of doing nothing: append to a list, in this process
        sink: list[dict[str, Any]] = []
        t_fit = time.time()
        _worker_body(cfg, time.time(), 0, 1, sink.append)
        t_end = time.time()
        steps = [m["step"] for m in sink]
        return {
            "t_fit": t_fit,
            "t_end": t_end,
            "reports_seen": len(sink),
            "reports_in_order": steps == _expected_steps(workload, cfg["steps"]),
        }
    import torch.multiprocessing as mp

    t_fit = time.time()
    mp.spawn(_raw_worker, args=(cfg,), nprocs=WORLD_SIZE, join=True, start_method="spawn")
    t_end = time.time()
    return {"t_fit": t_fit, "t_end": t_end}


DRIVERS: dict[str, Callable[[str, dict[str, Any], Path, Any], Record]] = {
    "phalanx": _drive_phalanx,
    "phalanx_spawn": _drive_phalanx_spawn,
    "phalanx_ray": _drive_phalanx_ray,
    "raytrain": _drive_raytrain,
    "raw": _drive_raw,
}


def _steps_for(system: str, workload: str, args: Any) -> int:
    if workload == "ddp":
        return DDP_STEPS
    if workload == "report":
        return args.ray_report_steps if system == "raytrain" else args.report_steps
    return 0


def run_one(args: argparse.Namespace) -> Record:
    """One measurement, in this (fresh) process."""
    for k, v in THREAD_ENV.items():
        os.environ.setdefault(k, v)
    system, workload = args.one
    t0 = time.perf_counter()
    _import_system(system, args.phalanx_trainer, _csv_free(args.driver_imports))
    import_s = time.perf_counter() - t0
    ready = time.time()
    tmp = Path(tempfile.mkdtemp(prefix=f"phxbench-{system}-{workload}-"))
    try:
        out = tmp / "out"
        out.mkdir()
        cfg: dict[str, Any] = {
            "workload": workload,
            "out_dir": str(out),
            "master_port": free_port(),
            "world_size": WORLD_SIZE,
            "steps": _steps_for(system, workload, args),
            "report_every": DDP_REPORT_EVERY if workload == "ddp" else 1,
            "init_pg": True,
        }
        rec = DRIVERS[system](workload, cfg, tmp, args)
        rec.update(_collect_worker_files(out, rec["t_fit"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rec.update(
        system=system,
        workload=workload,
        steps=cfg["steps"],
        import_s=import_s,
        fit_total_s=rec["t_end"] - rec["t_fit"],
        teardown_s=rec["t_end"] - rec["t_done"] if "t_done" in rec else None,
        step_ms=1e3 * rec["loop_s"] / cfg["steps"] if workload == "report" else None,
        ok=True,
    )
    if args.launched_at is not None:
        rec["launch_to_ready_s"] = ready - args.launched_at
    return rec


def _collect_worker_files(out: Path, t_fit: float) -> Record:
    rec: Record = {}
    first = out / "first_line_rank0.json"
    if first.exists():
        rec["first_line_s"] = json.loads(first.read_text())["t"] - t_fit
    ranks = sorted(out.glob("first_line_rank*.json"))
    if ranks:
        rec["first_line_all_ranks_s"] = max(json.loads(p.read_text())["t"] for p in ranks) - t_fit
    stats = out / "rank0.json"
    if stats.exists():
        data = json.loads(stats.read_text())
        rec["loop_s"] = data.pop("loop_s")
        rec["t_done"] = data.pop("t_done")
        rec["init_pg_s"] = data.pop("init_pg_s", None)
        rec["setup_s"] = data.pop("setup_s", None)
        latency = data.pop("latency", {})
        latency.pop("n", None)
        rec.update(latency)
        rec["threads"] = data
    return rec


# --------------------------------------------------------------------------- orchestration


def _child_env(marker: str) -> dict[str, str]:
    env = dict(os.environ, **THREAD_ENV, PYTHONUNBUFFERED="1")
    env[MARKER_ENV] = marker
    if importlib.util.find_spec("phalanx") is None:
        src = str(REPO / "src")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def launch(system: str, workload: str, rep: int, args: argparse.Namespace, logs: Path) -> Record:
    marker = uuid.uuid4().hex
    json_out = logs / f"{workload}-{system}-{rep}.json"
    log = logs / f"{workload}-{system}-{rep}.log"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        system,
        workload,
        "--json-out",
        str(json_out),
        "--report-steps",
        str(args.report_steps),
        "--ray-report-steps",
        str(args.ray_report_steps),
        "--phalanx-trainer",
        args.phalanx_trainer,
        "--driver-imports",
        args.driver_imports,
        "--launched-at",
        repr(time.time()),
    ]
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, env=_child_env(marker), stdout=fh, stderr=subprocess.STDOUT, cwd=REPO
        )
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    wall = time.perf_counter() - t0
    leftovers = reap_marked(marker, grace_s=5.0)
    rec: Record = {"system": system, "workload": workload, "rep": rep, "ok": False}
    if rc == 0 and json_out.exists():
        rec.update(json.loads(json_out.read_text()))
    else:
        rec["error"] = f"rc={rc}: " + log.read_text(errors="replace")[-3000:]
    rec.update(rep=rep, process_wall_s=wall, leftover_procs=leftovers)
    return rec


def _fmt(v: Any, unit: str = "s") -> str:
    if v is None:
        return "-"
    if unit in ("us", "ms"):
        return f"{v:.2f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def _summary_line(rec: Record) -> str:
    head = f"[{rec['workload']:6} rep {rec['rep']}] {rec['system']:8}"
    if not rec["ok"]:
        return f"{head} FAILED {rec['error'][-400:]}"
    keys = ["import_s", "first_line_s", "loop_s", "fit_total_s", "p50_us", "p99_us"]
    parts = [f"{k}={_fmt(rec[k])}" for k in keys if rec.get(k) is not None]
    if rec.get("leftover_procs"):
        parts.append(f"LEFTOVER={rec['leftover_procs']}")
    return f"{head} " + " ".join(parts)


# --------------------------------------------------------------------------- report


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine_info() -> Record:
    return {
        **machine(),
        "affinity": len(os.sched_getaffinity(0)),
        "loadavg_start": os.getloadavg(),
    }


def package_versions() -> Record:
    code = "import phalanx; print(getattr(phalanx, '__version__', 'importable, no __version__'))"
    res = subprocess.run(
        [sys.executable, "-c", code], env=_child_env("versions"), capture_output=True, text=True
    )
    return {
        "python": platform.python_version(),
        "torch": package_version("torch"),
        "ray": package_version("ray"),
        "phalanx": res.stdout.strip() if res.returncode == 0 else "not importable",
    }


def _values(runs: list[Record], system: str, workload: str, metric: str) -> dict[int, float]:
    return {
        r["rep"]: r[metric]
        for r in runs
        if r["system"] == system and r["workload"] == workload and r["ok"]
        if r.get(metric) is not None
    }


def _pair_ratio(runs: list[Record], workload: str, metric: str, a: str, b: str) -> float | None:
    va, vb = _values(runs, a, workload, metric), _values(runs, b, workload, metric)
    ratios = [va[k] / vb[k] for k in va.keys() & vb.keys() if vb[k] > 0]
    return median(ratios)


def _cell(runs: list[Record], system: str, workload: str, metric: str, unit: str) -> str:
    vals = list(_values(runs, system, workload, metric).values())
    if not vals:
        return "-"
    med = _fmt(median(vals), unit)
    return med if len(vals) == 1 else f"{med} ({_fmt(min(vals), unit)}..{_fmt(max(vals), unit)})"


METRICS: dict[str, list[tuple[str, str, str]]] = {
    "noop": [
        ("import_s", "import (s)", "s"),
        ("first_line_s", "fit() → first line, rank 0 (s)", "s"),
        ("first_line_all_ranks_s", "fit() → first line, all ranks (s)", "s"),
        ("fit_total_s", "fit() total (s)", "s"),
        ("process_wall_s", "whole process (s)", "s"),
    ],
    "ddp": [
        ("import_s", "import (s)", "s"),
        ("first_line_s", "fit() → first line, rank 0 (s)", "s"),
        ("setup_s", "setup (s)", "s"),
        ("loop_s", "200 steps incl. reports (s)", "s"),
        ("teardown_s", "teardown (s)", "s"),
        ("fit_total_s", "fit() total (s)", "s"),
        ("process_wall_s", "whole process (s)", "s"),
    ],
    "report": [
        ("steps", "reports", "n"),
        ("p50_us", "report() p50 (µs)", "us"),
        ("p99_us", "report() p99 (µs)", "us"),
        ("max_us", "report() max (µs)", "us"),
        ("mean_us", "report() mean (µs)", "us"),
        ("step_ms", "loop time per step incl. 1 ms busy work (ms)", "ms"),
        ("fit_total_s", "fit() total (s)", "s"),
    ],
}
TITLES = {
    "noop": "B1 startup — no-op training fn, 2 workers",
    "ddp": "B1 startup — tiny DDP job: Linear(10, 1), 200 SGD steps, 10 reports, 2 workers",
    "report": "B3 report cost — 1 ms of busy work + report() per step, 2 workers",
}
RATIO_PAIRS = (
    ("phalanx", "raytrain"),
    ("phalanx_spawn", "phalanx"),
    ("phalanx_ray", "raytrain"),
    ("phalanx", "raw"),
    ("raytrain", "raw"),
)


def _workload_section(runs: list[Record], workload: str, systems: list[str]) -> list[str]:
    metrics = METRICS[workload]
    lines = [f"## {TITLES[workload]}", ""]
    lines.append("Median (min..max) over the ok runs.")
    lines.append("")
    lines.append("| system | ok runs | " + " | ".join(m[1] for m in metrics) + " |")
    lines.append("| --- " * (len(metrics) + 2) + "|")
    for system in systems:
        sel = _select(runs, system, workload)
        ok, total = sum(1 for r in sel if r["ok"]), len(sel)
        cells = [
            _cell(runs, system, workload, m, unit)
            if unit != "n"
            else _steps_cell(runs, system, workload)
            for m, _, unit in metrics
        ]
        lines.append(f"| {system} | {ok}/{total} | " + " | ".join(cells) + " |")
    pairs = [(a, b) for a, b in RATIO_PAIRS if a in systems and b in systems]
    if pairs:
        lines += [
            "",
            "Ratios: median of the per-rep ratios (rep i of one system / rep i of the other).",
            "",
        ]
        lines.append("| metric | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |")
        lines.append("| --- " * (len(pairs) + 1) + "|")
        for m, label, unit in metrics:
            if unit == "n":
                continue
            cells = [_ratio_fmt(_pair_ratio(runs, workload, m, a, b)) for a, b in pairs]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += _checks(runs, workload, systems)
    return [*lines, ""]


def _steps_cell(runs: list[Record], system: str, workload: str) -> str:
    vals = set(_values(runs, system, workload, "steps").values())
    return ", ".join(str(v) for v in sorted(vals)) if vals else "-"


def _ratio_fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:,.0f}x"
    return f"{v:.2f}x" if v >= 0.1 else f"{v:.2g}x"


def _select(runs: list[Record], system: str, workload: str) -> list[Record]:
    return [r for r in runs if r["system"] == system and r["workload"] == workload]


def _checks(runs: list[Record], workload: str, systems: list[str]) -> list[str]:
    out = []
    for system in systems:
        sel = _select(runs, system, workload)
        ok = [r for r in sel if r["ok"]]
        checked = [r for r in ok if r.get("reports_in_order") is not None]
        left = sum(len(r.get("leftover_procs", [])) for r in sel)
        threads = {json.dumps(r["threads"], sort_keys=True) for r in ok if r.get("threads")}
        bits = []
        if checked:
            good = sum(1 for r in checked if r["reports_in_order"])
            seen = sorted({r["reports_seen"] for r in checked})
            bits.append(f"all reports arrived in order in {good}/{len(checked)} runs (seen {seen})")
        elif system == "raytrain" and workload != "noop":
            bits.append("in-order check n/a (Ray Train V2 keeps only checkpointed metrics)")
        if threads:
            bits.append("worker threads " + "; ".join(sorted(threads)))
        if left:
            bits.append(f"**{left} leftover processes killed after exit**")
        if bits:
            out.append(f"- {system}: " + "; ".join(bits))
    return ["", *out] if out else []


def _header(
    runs: list[Record], meta: Record, systems: list[str], workloads: list[str]
) -> list[str]:
    m, v = meta["machine"], meta["versions"]
    load = f"load avg {m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end"
    ray_init = _fmt(median(_all(runs, "raytrain", "ray_init_s")))
    extra = f" and {', '.join(meta['driver_imports'])}" if meta["driver_imports"] else ""
    phx_trainer = "TorchTrainer" if meta["phalanx_trainer"] == "torch" else "DataParallelTrainer"
    lines = [
        "# phalanx benchmarks B1 (startup) and B3 (report cost)",
        "",
        f"- date: {meta['date']}",
        f"- machine: {m['nproc']} CPUs (affinity {m['affinity']}), {m['memory_gib']} GiB, "
        f"{m['cpu_model']}; {load}",
        f"- versions: Python {v['python']}, torch {v['torch']}, ray {v['ray']}, "
        f"phalanx {v['phalanx']}",
        f"- command: `{meta['command']}`",
        f"- {meta['reps']} reps per system, interleaved ({' '.join(systems)}) in each rep; "
        "every run in a fresh Python subprocess; OMP_NUM_THREADS=MKL_NUM_THREADS=1 and "
        "torch.set_num_threads(1) in every worker; the driver imports torch before fit()"
        f"{extra}.",
        "- import: the heavy imports in the subprocess (torch, torch.distributed, DDP, and the "
        "system's own modules). fit() → first line: `time.time()` just before `fit()` / "
        "`mp.spawn` in the driver to the first line of the training fn. setup: first line to "
        "the first step (init_process_group, DDP(), data). teardown: rank 0 done to fit() "
        "returned. whole process: launch to exit of the subprocess.",
        f"- raytrain: `ray.init(address='local', num_cpus=2, include_dashboard=False)` "
        "per run (median "
        f"{ray_init} s, outside fit()); TorchTrainer for ddp, V2 DataParallelTrainer otherwise; "
        "Ray's default settings (Train V2).",
        "- phalanx_ray: phalanx on its Ray engine (one actor per worker in a placement group) on "
        "a fresh local Ray started like raytrain's (median "
        f"{_fmt(median(_all(runs, 'phalanx_ray', 'ray_init_s')))} s, outside fit()); same "
        "trainer as phalanx.",
        f"- phalanx: {phx_trainer} for ddp (DataParallelTrainer: gloo init_process_group "
        "in the train fn).",
        "- phalanx_spawn: phalanx's local engine on its portable start path "
        "(PHALANX_START_METHOD=spawn: each worker a new interpreter, as on macOS or after the "
        "driver initialised CUDA); same trainer as phalanx.",
        "- raw: `torch.multiprocessing.spawn` + gloo `init_process_group` on 127.0.0.1, no "
        "report; B3 raw = a plain loop appending the dict to a list, in one process.",
    ]
    if max(m["loadavg_start"][0], m["loadavg_end"][0]) > m["nproc"]:
        lines.append(
            "- **warning: load average above the CPU count during the run (other jobs on "
            "the machine); absolute seconds are inflated, trust the pairwise ratios more.**"
        )
    if "report" in workloads and "raytrain" in systems:
        lines.append(
            f"- B3: Ray Train runs {meta['ray_report_steps']} steps, not "
            f"{meta['report_steps']}: its report() blocks ~2 s (the worker's result queue has "
            "size 1 and the controller drains it once per RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, "
            "2 s by default). Compare per-step figures, not totals."
        )
    return [*lines, ""]


def write_report(
    runs: list[Record], meta: Record, systems: list[str], workloads: list[str], out: Path
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    blob = json.dumps({"meta": meta, "runs": runs}, indent=1, default=str)
    out.with_suffix(".json").write_text(blob + "\n")
    lines = _header(runs, meta, systems, workloads)
    for workload in workloads:
        lines += _workload_section(runs, workload, systems)
    failed = [r for r in runs if not r["ok"]]
    if failed:
        lines += ["## Failed runs", ""]
        lines += [
            f"- {r['workload']} {r['system']} rep {r['rep']}: `{_one_line(r['error'])}`"
            for r in failed
        ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def _one_line(s: str) -> str:
    tail = [ln for ln in s.strip().splitlines() if ln.strip()][-1:] or [""]
    return tail[0].replace("`", "'")[:300]


def _all(runs: list[Record], system: str, metric: str) -> list[float]:
    return [
        r[metric] for r in runs if r["system"] == system and r["ok"] and r.get(metric) is not None
    ]


def run_all(args: argparse.Namespace) -> None:
    systems = _csv(args.systems, SYSTEMS)
    workloads = _csv(args.workloads, WORKLOADS)
    meta: Record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "versions": package_versions(),
        "reps": args.reps,
        "systems": systems,
        "workloads": workloads,
        "report_steps": args.report_steps,
        "ray_report_steps": args.ray_report_steps,
        "phalanx_trainer": args.phalanx_trainer,
        "driver_imports": _csv_free(args.driver_imports),
    }
    print(json.dumps(meta["versions"]), json.dumps(meta["machine"]), flush=True)
    runs: list[Record] = []
    logs = Path(tempfile.mkdtemp(prefix="phxbench-logs-"))
    try:
        for workload in workloads:
            for rep in range(args.reps):
                for system in systems:
                    rec = launch(system, workload, rep, args, logs)
                    runs.append(rec)
                    print(_summary_line(rec), flush=True)
    finally:
        meta["machine"]["loadavg_end"] = os.getloadavg()
        write_report(runs, meta, systems, workloads, Path(args.out))
        if args.keep_logs:
            print(f"logs kept in {logs}")
        else:
            shutil.rmtree(logs, ignore_errors=True)
    print(f"wrote {args.out}.md and {args.out}.json")


def _csv_free(value: str | None) -> list[str]:
    return [s.strip() for s in value.split(",") if s.strip()] if value else []


def _csv(value: str | None, allowed: tuple[str, ...]) -> list[str]:
    items = [s.strip() for s in value.split(",") if s.strip()] if value else list(allowed)
    bad = [s for s in items if s not in allowed]
    if bad:
        raise SystemExit(f"unknown: {bad}; choose from {allowed}")
    return items


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--systems", help=f"comma-separated subset of {','.join(SYSTEMS)}")
    p.add_argument("--workloads", help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--report-steps", type=int, default=REPORT_STEPS)
    p.add_argument("--ray-report-steps", type=int, default=50)
    p.add_argument(
        "--phalanx-trainer",
        choices=("dp", "torch"),
        default="dp",
        help="ddp workload: DataParallelTrainer + own init_process_group (dp) or TorchTrainer",
    )
    p.add_argument(
        "--driver-imports",
        default="",
        help="extra modules every driver imports before fit(), e.g. torch._dynamo "
        "(DDP() imports it lazily: ~1.3 s in each worker that lacks it)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="per-run limit in seconds")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "startup"))
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--render", metavar="JSON", help="only rewrite the tables from a results JSON")
    p.add_argument("--one", nargs=2, metavar=("SYSTEM", "WORKLOAD"), help=argparse.SUPPRESS)
    p.add_argument("--json-out", help=argparse.SUPPRESS)
    p.add_argument("--launched-at", type=float, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.render:
        data = json.loads(Path(args.render).read_text())
        meta = data["meta"]
        write_report(data["runs"], meta, meta["systems"], meta["workloads"], Path(args.out))
    elif args.one:
        rec = run_one(args)
        text = json.dumps(rec, default=str)
        if args.json_out:
            Path(args.json_out).write_text(text)
        else:
            print(text)
    else:
        run_all(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""B1 startup and B3 report cost: phalanx vs Ray Train 2.60 vs raw torch, side by side.

Run from the repository root:

    python bench/startup.py                                  # everything, 3 reps
    python bench/startup.py --systems raw,raytrain --reps 3  # before phalanx exists
    python bench/startup.py --systems phalanx_ray,raytrain   # phalanx's Ray engine vs Ray Train
    python bench/startup.py --systems phalanx,phalanx_spawn  # fork server vs spawn start path
    python bench/startup.py --workloads noop,ddp --reps 5
    python bench/startup.py --before-src /tmp/before/src --systems phalanx,phalanx_before \
        --workloads noop,report                              # this tree vs that src's phalanx

Workloads (2 workers each):
  noop    the training fn records the time of its first line and returns.
  ddp     Linear(10, 1) in DDP (gloo), 200 SGD steps, report() every 20 steps (raw: no report).
  report  (B3) 2,000 steps of 1 ms busy work, report() every step, latency of each call
          measured in rank 0. Ray Train gets fewer steps (--ray-report-steps), because its
          report() blocks for seconds. Raw: a plain loop appending the dict to a list.

``phalanx_before`` (only with ``--before-src``) is ``phalanx`` with ``PYTHONPATH`` at that src:
the same workloads on an earlier tree's phalanx (e.g. a worktree of the commit before a change).

Every measurement runs in a fresh Python subprocess (bench/harness.py: this script with ``--one
WORKLOAD-SYSTEM``, every process it starts marked and any left over killed), interleaved A B C
A B C ... within each rep. Results go to bench/results/startup.{md,json}.
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
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
from common import free_port, median, spin

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("phalanx", "phalanx_spawn", "phalanx_ray", "raytrain", "raw")
BEFORE = "phalanx_before"  # phalanx imported from --before-src
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
    if system in ("phalanx", "phalanx_spawn", "phalanx_ray", BEFORE):
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
    BEFORE: _drive_phalanx,  # the same driver; run_env points PYTHONPATH at --before-src
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
    workload, system = args.one.split("-", 1)
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
        sut=system,
        workload=workload,
        phalanx_src=_phalanx_src(system),
        steps=cfg["steps"],
        import_s=import_s,
        fit_total_s=rec["t_end"] - rec["t_fit"],
        teardown_s=rec["t_end"] - rec["t_done"] if "t_done" in rec else None,
        step_ms=1e3 * rec["loop_s"] / cfg["steps"] if workload == "report" else None,
    )
    launched_at = os.environ.get(harness.LAUNCHED_AT_ENV)
    if launched_at is not None:
        rec["launch_to_ready_s"] = ready - float(launched_at)
    return rec


def _phalanx_src(system: str) -> str | None:
    """The src directory this run's phalanx came from (the check that ``phalanx_before`` ran
    the --before-src tree)."""
    if not system.startswith("phalanx"):
        return None
    import phalanx

    return str(Path(phalanx.__file__).resolve().parent.parent)


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


# --------------------------------------------------------------------------- report


def _fmt(v: Any, unit: str = "s") -> str:
    if v is None:
        return "-"
    if unit in ("us", "ms"):
        return f"{v:.2f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def _values(runs: list[Record], system: str, workload: str, metric: str) -> dict[int, float]:
    return {
        r["rep"]: r[metric]
        for r in runs
        if r.get("sut") == system and r["workload"] == workload and r["ok"]
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
        ("e2e_s", "whole process (s)", "s"),
    ],
    "ddp": [
        ("import_s", "import (s)", "s"),
        ("first_line_s", "fit() → first line, rank 0 (s)", "s"),
        ("setup_s", "setup (s)", "s"),
        ("loop_s", "200 steps incl. reports (s)", "s"),
        ("teardown_s", "teardown (s)", "s"),
        ("fit_total_s", "fit() total (s)", "s"),
        ("e2e_s", "whole process (s)", "s"),
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
    ("phalanx", BEFORE),
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
    return [r for r in runs if r["system"] == f"{workload}-{system}"]


def _checks(runs: list[Record], workload: str, systems: list[str]) -> list[str]:
    out = []
    for system in systems:
        sel = _select(runs, system, workload)
        ok = [r for r in sel if r["ok"]]
        checked = [r for r in ok if r.get("reports_in_order") is not None]
        left = sum(len(r.get("leftover", [])) for r in sel)
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


def workload(meta: Record) -> list[str]:
    systems, workloads = _split(meta)
    m = meta["machine"]
    extra = f" and {meta['driver_imports']}" if meta["driver_imports"] else ""
    phx_trainer = "TorchTrainer" if meta["phalanx_trainer"] == "torch" else "DataParallelTrainer"
    lines = [
        f"- CPU affinity {m.get('affinity', '?')} (of {m['nproc']}); workloads {', '.join(workloads)}; systems "
        f"{', '.join(systems)}; OMP_NUM_THREADS=MKL_NUM_THREADS=1 and torch.set_num_threads(1) "
        f"in every worker; the driver imports torch before fit(){extra}.",
        "- import: the heavy imports in the subprocess (torch, torch.distributed, DDP, and the "
        "system's own modules). fit() → first line: `time.time()` just before `fit()` / "
        "`mp.spawn` in the driver to the first line of the training fn. setup: first line to "
        "the first step (init_process_group, DDP(), data). teardown: rank 0 done to fit() "
        "returned. whole process: launch to exit of the subprocess.",
        "- raytrain: `ray.init(address='local', num_cpus=2, include_dashboard=False)` per run "
        "(outside fit()); TorchTrainer for ddp, V2 DataParallelTrainer otherwise; Ray's default "
        "settings (Train V2).",
        "- phalanx_ray: phalanx on its Ray engine (one actor per worker in a placement group) on "
        "a fresh local Ray started like raytrain's (outside fit()); same trainer as phalanx.",
        f"- phalanx: {phx_trainer} for ddp (DataParallelTrainer: gloo init_process_group "
        "in the train fn).",
        "- phalanx_spawn: phalanx's local engine on its portable start path "
        "(PHALANX_START_METHOD=spawn: each worker a new interpreter, as on macOS or after the "
        "driver initialised CUDA); same trainer as phalanx.",
        "- raw: `torch.multiprocessing.spawn` + gloo `init_process_group` on 127.0.0.1, no "
        "report; B3 raw = a plain loop appending the dict to a list, in one process.",
    ]
    if max(m["load_start"], m.get("load_end", 0.0)) > m["nproc"]:
        lines.append(
            "- **warning: load average above the CPU count during the run (other jobs on "
            "the machine); absolute seconds are inflated, trust the pairwise ratios more.**"
        )
    if BEFORE in systems:
        lines.append(
            f"- {BEFORE}: phalanx (local engine, same trainer) imported from "
            f"`{meta.get('before_src')}`; phalanx: from this tree's src."
        )
    if "report" in workloads and "raytrain" in systems:
        lines.append(
            f"- B3: Ray Train runs {meta['ray_report_steps']} steps, not "
            f"{meta['report_steps']}: its report() blocks ~2 s (the worker's result queue has "
            "size 1 and the controller drains it once per RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, "
            "2 s by default). Compare per-step figures, not totals."
        )
    return lines


def report(runs: list[Record], meta: Record) -> list[str]:
    systems, workloads = _split(meta)
    lines = []
    for name in ("raytrain", "phalanx_ray"):
        if name in systems:
            ray_init = _fmt(median(_all(runs, name, "ray_init_s")))
            lines.append(f"- {name}: ray.init() median {ray_init} s, outside fit().")
    lines.append("")
    for workload in workloads:
        lines += _workload_section(runs, workload, systems)
    return lines


def _split(meta: Record) -> tuple[list[str], list[str]]:
    """The systems under test and the workloads, in the order the runs named them."""
    systems: list[str] = []
    workloads: list[str] = []
    for name in meta["systems"]:
        workload, system = name.split("-", 1)
        systems += [system] if system not in systems else []
        workloads += [workload] if workload not in workloads else []
    return systems, workloads


def _all(runs: list[Record], system: str, metric: str) -> list[float]:
    return [
        r[metric] for r in runs if r.get("sut") == system and r["ok"] and r.get(metric) is not None
    ]


def _csv_free(value: str | None) -> list[str]:
    return [s.strip() for s in value.split(",") if s.strip()] if value else []


def _csv(value: str | None, allowed: tuple[str, ...]) -> list[str]:
    items = [s.strip() for s in value.split(",") if s.strip()] if value else list(allowed)
    bad = [s for s in items if s not in allowed]
    if bad:
        raise SystemExit(f"unknown: {bad}; choose from {allowed}")
    return items


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    p.add_argument("--report-steps", type=int, default=REPORT_STEPS)
    p.add_argument("--ray-report-steps", type=int, default=50)
    p.add_argument(
        "--phalanx-trainer",
        choices=("dp", "torch"),
        default="dp",
        help="ddp workload: DataParallelTrainer + own init_process_group (dp) or TorchTrainer",
    )
    p.add_argument("--before-src", help=f"adds {BEFORE}: phalanx imported from this src")
    p.add_argument(
        "--driver-imports",
        default="",
        help="extra modules every driver imports before fit(), e.g. torch._dynamo "
        "(DDP() imports it lazily: ~1.3 s in each worker that lacks it)",
    )


def _run_env(name: str, args: argparse.Namespace) -> dict[str, str]:
    """``phalanx_before`` runs import phalanx from ``--before-src``."""
    if name.split("-", 1)[1] == BEFORE:
        if not args.before_src:
            raise SystemExit(f"{BEFORE} needs --before-src (the src directory of that tree)")
        return {"PYTHONPATH": os.pathsep.join([str(REPO / "bench"), args.before_src])}
    return {}


BENCH = harness.Bench(
    name="startup",
    title="phalanx benchmarks B1 (startup) and B3 (report cost)",
    systems=tuple(f"{w}-{s}" for w in WORKLOADS for s in (*SYSTEMS, BEFORE)),
    run_env=_run_env,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("import_s", "first_line_s", "loop_s", "fit_total_s", "p50_us", "p99_us"),
    reps=3,
    timeout_s=600.0,
    marked=True,
    digits=3,
)


def main() -> None:
    args = harness.parse_args(BENCH)
    if not args.one and not args.render:
        # --systems names systems under test, each run on every one of --workloads.
        default = (*SYSTEMS, BEFORE) if args.before_src else SYSTEMS
        given = default if args.systems == ",".join(BENCH.systems) else args.systems.split(",")
        chosen = _csv(",".join(given), (*SYSTEMS, BEFORE))
        args.systems = ",".join(f"{w}-{s}" for w in _csv(args.workloads, WORKLOADS) for s in chosen)
    harness.main(BENCH, args)


if __name__ == "__main__":
    main()

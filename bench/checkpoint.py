#!/usr/bin/env python
"""B4 checkpoint cost: phalanx vs Ray Train 2.60 vs the raw floor, side by side.

Run from the repository root:

    python bench/checkpoint.py                       # the default plan, 3 reps (~20 min)
    python bench/checkpoint.py --reps 1 --cases local:64:sync,s3:64:async
    python bench/checkpoint.py --systems phalanx,raw --reps 5
    python bench/checkpoint.py --sizes 8 --reps 1 --systems phalanx,raw   # a smoke run

A case is ``STORAGE:SIZE_MB:MODE``:

  local  the worker writes its checkpoint in a temporary directory on the same filesystem as
         ``storage_path`` (both under /tmp): a commit can be a rename.
  xfs    the temporary directory is on /dev/shm (tmpfs), ``storage_path`` on /tmp (disk): every
         byte has to be copied across filesystems.
  s3     ``storage_path`` is a bucket on a moto server (``moto_server`` in its own process on
         127.0.0.1), the temporary directory is on /tmp.

Mode: ``sync`` (SYNC: the directory is copied and left as it was), ``syncdel`` (SYNC with
``delete_local_checkpoint_after_upload=True``: the files may be moved), ``async`` (ASYNC, whose
default is ``delete_local_checkpoint_after_upload=True``), ``asynckeep`` (ASYNC with
``delete_local_checkpoint_after_upload=False``: read in the background). ``--sizes`` replaces
the sizes of every case (e.g. ``--sizes 8`` for a smoke run). The training loop (2 workers): 80 steps
of 5 ms busy work; every 20 steps rank 0 writes SIZE_MB random bytes to ``model.bin`` in a fresh
directory (not timed) and calls ``report(..., checkpoint=...)``; ``CheckpointConfig(num_to_keep=3)``.
phalanx: every rank reports every step. Ray Train: every rank reports only at the checkpoint
steps (its report() blocks ~seconds per call). The raw floor (one process, no framework): the
same bytes written to a file on the same disk + fsync (the floor a SYNC copy is held to), a
plain ``shutil.copytree`` of the checkpoint directory into storage, a rename into the storage
directory; for xfs a copy from /dev/shm + fsync; for s3 an ``s3fs`` ``put_file``.

Metrics: blocked = wall time of rank 0's ``report()`` call that carries a checkpoint;
committed = that call's start (``time.time()`` in the metrics) to the driver-side callback's
``after_report`` seeing the checkpoint; fit() total. Every measurement runs in a fresh Python
subprocess (bench/harness.py: this script with ``--one SYSTEM@CASE``, every process it starts
marked and any left over killed), interleaved phalanx, Ray Train, raw in each rep, one moto
server for them all. Results go to bench/results/checkpoint.{md,json} (``--render JSON``
rewrites the markdown). Only the standard library is imported at
module level; workers run functions shipped by value from ``__main__``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from common import free_port, median, spin

SYSTEMS = ("phalanx", "raytrain", "raw")
STORAGES = ("local", "xfs", "s3")
MODES = ("sync", "syncdel", "async", "asynckeep")
# mode -> (checkpoint_upload_mode, delete_local_checkpoint_after_upload)
MODE_ARGS: dict[str, tuple[str, bool | None]] = {
    "sync": ("sync", None),
    "syncdel": ("sync", True),
    "async": ("async", None),
    "asynckeep": ("async", False),
}
# S3 (moto) takes ~3 s per 64 MB here and a Ray Train run 70-100 s (load avg ~15): to keep the
# whole run near 20 minutes (3 reps), S3 runs at 64 MB only and Ray Train on two cases.
DEFAULT_CASES = ",".join(
    [f"local:{size}:{mode}" for size in (64, 256, 1024) for mode in MODES]
    + ["xfs:256:sync,xfs:256:async,s3:64:sync,s3:64:async"]
)
DEFAULT_RAY_CASES = "local:256:sync,local:256:async,s3:64:async"
WORLD_SIZE = 2
STEPS = 80
CKPT_EVERY = 20
NUM_TO_KEEP = 3
STEP_S = 0.005
MB = 1 << 20
BUCKET = "phalanx-bench"
S3_KEY = "bench"
S3_SECRET = "bench"
S3_REGION = "us-east-1"
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

Record = dict[str, Any]
ReportFn = Callable[..., Any]


@dataclass(frozen=True)
class Case:
    storage: str
    size_mb: int
    mode: str

    @classmethod
    def parse(cls, text: str) -> Case:
        storage, size, mode = text.split(":")
        if storage not in STORAGES or mode not in MODES:
            raise ValueError(f"bad case {text!r}: STORAGE:SIZE_MB:MODE, e.g. local:64:sync")
        return cls(storage, int(size), mode)

    @property
    def key(self) -> str:
        return f"{self.storage}:{self.size_mb}:{self.mode}"


# --------------------------------------------------------------------------- worker side
# These run inside training workers (forked processes or Ray actors); cloudpickle ships them
# by value from __main__. Only the standard library and numpy.


def _payload(size: int) -> memoryview:
    """``size`` random bytes (float64 draws: ~8x faster than Generator.bytes, no copy)."""
    import numpy as np

    return np.random.default_rng(0).random(size // 8).view(np.uint8).data


def _write_file(path: str, payload: memoryview) -> None:
    with open(path, "wb") as f:
        f.write(payload)


@contextmanager
def _checkpoint_dir(parent: str, keep: bool) -> Iterator[str]:
    """A fresh directory; removed on exit unless ``keep`` (Ray ASYNC deletes it itself)."""
    if keep:
        yield tempfile.mkdtemp(prefix="ckpt-", dir=parent)
        return
    with tempfile.TemporaryDirectory(prefix="ckpt-", dir=parent) as d:
        yield d


def _train_loop(cfg: dict[str, Any], rank: int, report: ReportFn, ckpt_report: ReportFn) -> None:
    """The B4 loop. ``ckpt_report(metrics, directory)`` reports a checkpoint of ``directory``."""
    t_first = time.time()
    payload = _payload(cfg["size"] if rank == 0 else 0)
    payload_s = time.time() - t_first
    blocked: list[float] = []
    t_loop = time.perf_counter()
    t_start = time.time()
    for step in range(cfg["steps"]):
        spin(STEP_S)
        is_ckpt = step % CKPT_EVERY == 0
        if is_ckpt and rank == 0:
            with _checkpoint_dir(cfg["tmp"], cfg["keep_dir"]) as d:
                _write_file(os.path.join(d, "model.bin"), payload)
                metrics = {"step": step, "t_report": time.time()}
                t0 = time.perf_counter()
                ckpt_report(metrics, d)
                blocked.append(time.perf_counter() - t0)
        elif is_ckpt or cfg["report_every_step"]:
            report({"step": step, "t_report": time.time()})
    loop_s = time.perf_counter() - t_loop
    if rank == 0:
        out = Path(cfg["out_dir"]) / "rank0.json"
        times = {
            "t_first": t_first,
            "payload_s": payload_s,
            "t_start": t_start,
            "t_done": time.time(),
        }
        out.write_text(json.dumps({"blocked_s": blocked, "loop_s": loop_s, **times}))


def _phalanx_train_fn(config: dict[str, Any]) -> None:
    import phalanx as train

    upload, delete = config["mode_args"]
    mode = train.CheckpointUploadMode(upload)

    def ckpt_report(metrics: dict[str, Any], d: str) -> None:
        ckpt = train.Checkpoint.from_directory(d)
        train.report(
            metrics,
            checkpoint=ckpt,
            checkpoint_upload_mode=mode,
            delete_local_checkpoint_after_upload=delete,
        )

    _train_loop(config, train.get_context().get_world_rank(), train.report, ckpt_report)


def _ray_train_fn(config: dict[str, Any]) -> None:
    import ray.train

    upload, delete = config["mode_args"]
    mode = ray.train.CheckpointUploadMode[upload.upper()]
    # ASYNC uploads after report() returns: the directory must outlive the call; Ray deletes it
    # after the upload when delete_local_checkpoint_after_upload is True (ASYNC's default).
    if delete is None:
        delete = mode is ray.train.CheckpointUploadMode.ASYNC

    def ckpt_report(metrics: dict[str, Any], d: str) -> None:
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(d),
            checkpoint_upload_mode=mode,
            delete_local_checkpoint_after_upload=delete,
        )

    rank = ray.train.get_context().get_world_rank()
    keep = delete or mode is ray.train.CheckpointUploadMode.ASYNC
    _train_loop({**config, "keep_dir": keep}, rank, ray.train.report, ckpt_report)


def _commit_log_line(path: str, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
    if checkpoint is None:
        return
    line = {"t_commit": time.time(), "step": metrics[0]["step"], "t_report": metrics[0]["t_report"]}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _commit_callback(base: type, path: str) -> Any:
    """A driver-side callback that logs when each checkpoint is committed (both systems)."""

    class CommitLog(base):  # type: ignore[valid-type,misc]
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            _commit_log_line(path, metrics, checkpoint)

    return CommitLog()


# --------------------------------------------------------------------------- one measurement


def _s3_endpoint(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def _s3fs(port: int) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        key=S3_KEY,
        secret=S3_SECRET,
        client_kwargs={"endpoint_url": _s3_endpoint(port), "region_name": S3_REGION},
    )


def _loop_config(case: Case, tmp: Path, out: Path, system: str) -> dict[str, Any]:
    work = Path("/dev/shm") / tmp.name if case.storage == "xfs" else tmp / "work"
    work.mkdir(parents=True, exist_ok=True)
    return {
        "steps": STEPS,
        "size": case.size_mb * MB,
        "mode": case.mode,
        "tmp": str(work),
        "out_dir": str(out),
        "report_every_step": system == "phalanx",
        "mode_args": MODE_ARGS[case.mode],
        # ASYNC without delete reads the directory after report() returns: it must outlive it
        "keep_dir": case.mode == "asynckeep",
    }


def _drive_phalanx(case: Case, cfg: dict[str, Any], tmp: Path, args: Any) -> Record:
    import phalanx as train

    fs, storage_path = None, str(tmp / "storage")
    if case.storage == "s3":
        fs, storage_path = _s3fs(args.s3_port), f"s3://{BUCKET}/{tmp.name}"
    trainer = train.DataParallelTrainer(
        _phalanx_train_fn,
        train_loop_config=cfg,
        scaling_config=train.ScalingConfig(num_workers=WORLD_SIZE),
        run_config=train.RunConfig(
            name="run",
            storage_path=storage_path,
            storage_filesystem=fs,
            checkpoint_config=train.CheckpointConfig(num_to_keep=NUM_TO_KEEP),
            callbacks=[_commit_callback(train.Callback, cfg["commit_log"])],
        ),
    )
    t_fit = time.time()
    result = trainer.fit()
    t_end = time.time()
    error = repr(result.error) if result.error else None
    return {"fit_s": t_end - t_fit, "t_fit": t_fit, "t_end": t_end, "error": error}


def _drive_raytrain(case: Case, cfg: dict[str, Any], tmp: Path, args: Any) -> Record:
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig, UserCallback
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    fs, storage_path = None, str(tmp / "storage")
    if case.storage == "s3":
        # pyarrow's native S3FileSystem fails CompleteMultipartUpload against moto 5.2.1
        # ("error embedded in a 200 OK response"): Ray gets the same s3fs client as phalanx.
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        fs = PyFileSystem(FSSpecHandler(_s3fs(args.s3_port)))
        storage_path = f"{BUCKET}/{tmp.name}"
    t0 = time.perf_counter()
    # address="local": a fresh cluster; _temp_dir: its session files go away with ours.
    ray.init(
        address="local", num_cpus=WORLD_SIZE, include_dashboard=False, _temp_dir=str(tmp / "ray")
    )
    init_s = time.perf_counter() - t0
    try:
        trainer = DataParallelTrainer(
            _ray_train_fn,
            train_loop_config=cfg,
            scaling_config=ScalingConfig(num_workers=WORLD_SIZE),
            run_config=RunConfig(
                name="run",
                storage_path=storage_path,
                storage_filesystem=fs,
                checkpoint_config=CheckpointConfig(num_to_keep=NUM_TO_KEEP),
                callbacks=[_commit_callback(UserCallback, cfg["commit_log"])],
            ),
        )
        t_fit = time.time()
        result = trainer.fit()
        t_end = time.time()
    finally:
        ray.shutdown()
    error = repr(result.error) if result.error else None
    times = {"fit_s": t_end - t_fit, "t_fit": t_fit, "t_end": t_end, "ray_init_s": init_s}
    return {**times, "error": error}


def _drive_raw(case: Case, cfg: dict[str, Any], tmp: Path, args: Any) -> Record:
    """The floor, in this process: the same loop and bytes, no framework."""
    payload = _payload(cfg["size"])
    store = Path(tmp / "storage" / "run")
    store.mkdir(parents=True)
    s3 = _s3fs(args.s3_port) if case.storage == "s3" else None
    timings: dict[str, list[float]] = {}
    kept: list[int] = []
    t0 = time.perf_counter()
    for step in range(cfg["steps"]):
        spin(STEP_S)
        if step % CKPT_EVERY != 0:
            continue
        for name, seconds in _raw_checkpoint(case, cfg, tmp, store, step, payload, s3):
            timings.setdefault(name, []).append(seconds)
        kept.append(step)
        if len(kept) > NUM_TO_KEEP:
            _raw_delete(case, tmp, store, kept.pop(0), s3)
    return {"fit_s": time.perf_counter() - t0, "raw": timings, "error": None}


def _boto3_client(port: int) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=_s3_endpoint(port),
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_SECRET,
        region_name=S3_REGION,
    )


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _write_fsync(path: Path, payload: memoryview) -> tuple[float, float]:
    """Write ``payload`` to ``path``; return (write seconds, fsync seconds)."""
    with open(path, "wb") as f:
        t0 = time.perf_counter()
        f.write(payload)
        f.flush()
        t1 = time.perf_counter()
        os.fsync(f.fileno())
        return t1 - t0, time.perf_counter() - t1


def _copy_fsync(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 16 * MB)
        fout.flush()
        os.fsync(fout.fileno())


def _raw_checkpoint(
    case: Case,
    cfg: dict[str, Any],
    tmp: Path,
    store: Path,
    step: int,
    payload: memoryview,
    s3: Any,
) -> list[tuple[str, float]]:
    """One checkpoint's floor: the same bytes written, synced, moved or uploaded."""
    work = Path(cfg["tmp"]) / f"ckpt-{step}"  # where the framework's worker writes it
    work.mkdir()
    _write_file(str(work / "model.bin"), payload)
    out: list[tuple[str, float]] = []
    if case.storage == "s3":
        key = f"{tmp.name}/run/checkpoint_{step:06d}/model.bin"
        src = str(work / "model.bin")
        out.append(("s3fs_put_s", _timed(lambda: s3.put_file(src, f"{BUCKET}/{key}"))))
    elif case.storage == "xfs":  # the source is a file on tmpfs, the target on disk
        dst = store / f"copy_{step:06d}"
        out.append(("copy_fsync_s", _timed(lambda: _copy_fsync(work / "model.bin", dst))))
        dst.unlink()
    if case.storage != "s3":  # what a SYNC copy is compared with: a plain copytree, no fsync
        copied = store / f"copytree_{step:06d}"
        out.append(("copytree_s", _timed(lambda: shutil.copytree(work, copied))))
        shutil.rmtree(copied)
    aside = Path(cfg["tmp"]) / f"aside-{step}"  # async: move the files aside, same filesystem
    out.append(("rename_s", _timed(lambda: os.rename(work, aside))))
    shutil.rmtree(aside)
    if case.storage != "s3":  # the disk floor: write + fsync into the storage directory
        target = store / f"checkpoint_{step:06d}"
        target.mkdir()
        write_s, fsync_s = _write_fsync(target / "model.bin", payload)
        out += [("write_s", write_s), ("fsync_s", fsync_s), ("write_fsync_s", write_s + fsync_s)]
    return out


def _raw_delete(case: Case, tmp: Path, store: Path, step: int, s3: Any) -> None:
    if case.storage == "s3":
        key = f"{tmp.name}/run/checkpoint_{step:06d}/model.bin"
        s3.rm_file(f"{BUCKET}/{key}")
    else:
        shutil.rmtree(store / f"checkpoint_{step:06d}")


DRIVERS: dict[str, Callable[[Case, dict[str, Any], Path, Any], Record]] = {
    "phalanx": _drive_phalanx,
    "raytrain": _drive_raytrain,
    "raw": _drive_raw,
}


def _committed(log: Path) -> list[Record]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _list_checkpoints(case: Case, tmp: Path, args: Any) -> dict[str, int]:
    """Checkpoint directories left in storage after fit() -> bytes of their model.bin."""
    if case.storage == "s3":
        fs = _s3fs(args.s3_port)
        found = fs.find(f"{BUCKET}/{tmp.name}")
        return {
            p.split("/")[-2]: int(fs.size(p))
            for p in found
            if p.endswith("/model.bin") and "checkpoint_" in p.split("/")[-2]
        }
    root = tmp / "storage"
    return {
        p.parent.name: p.stat().st_size
        for p in root.rglob("model.bin")
        if p.parent.name.startswith("checkpoint_")
    }


def _cleanup(case: Case, tmp: Path, args: Any) -> None:
    shutil.rmtree(Path("/dev/shm") / tmp.name, ignore_errors=True)
    if case.storage == "s3":
        fs = _s3fs(args.s3_port)
        if fs.exists(f"{BUCKET}/{tmp.name}"):
            fs.rm(f"{BUCKET}/{tmp.name}", recursive=True)


def run_one(args: argparse.Namespace) -> Record:
    """One measurement, in this (fresh) process."""
    system, case = _parse_name(args.one)
    tmp = Path(tempfile.mkdtemp(prefix=f"b4-{system[:3]}-", dir=args.tmp_root))
    (tmp / "t").mkdir()
    os.environ["TMPDIR"] = str(tmp / "t")  # phalanx logs of a remote run, stray temp files
    tempfile.tempdir = None
    try:
        out = tmp / "out"
        out.mkdir()
        cfg = _loop_config(case, tmp, out, system)
        cfg["commit_log"] = str(out / "commits.jsonl")
        rec = DRIVERS[system](case, cfg, tmp, args)
        rank0 = out / "rank0.json"
        if rank0.exists():
            rec.update(json.loads(rank0.read_text()))
        rec["commits"] = _committed(out / "commits.jsonl")
        if system != "raw":
            rec["checkpoints_left"] = _list_checkpoints(case, tmp, args)
    finally:
        _cleanup(case, tmp, args)
        shutil.rmtree(tmp, ignore_errors=True)
    rec["summary"] = summarize({**rec, "system": system, "ok": rec.get("error") is None})
    return {**rec, "sut": system, "case": case.key}


def _name(system: str, case: Case) -> str:
    return f"{system}@{case.key}"


def _parse_name(name: str) -> tuple[str, Case]:
    system, case = name.split("@", 1)
    return system, Case.parse(case)


# --------------------------------------------------------------------------- orchestration


@contextmanager
def moto_server(needed: bool, logs: Path) -> Iterator[int]:
    """A moto S3 server in its own process (its own GIL), with the bench bucket; yields the port."""
    if not needed:
        yield 0
        return
    port = free_port()
    exe = shutil.which("moto_server") or "moto_server"
    with (logs / "moto.log").open("w") as log:
        proc = subprocess.Popen(
            [exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        _wait_for_port(port, proc)
        _boto3_client(port).create_bucket(Bucket=BUCKET)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("moto_server did not start")


def _plan(cases: list[Case], systems: list[str], ray_cases: set[str]) -> list[tuple[str, Case]]:
    """One rep: each case's systems in turn; raw once per (storage, size), mode-independent;
    Ray Train only for ``ray_cases`` (a run costs ~70 s here)."""
    order: list[tuple[str, Case]] = []
    seen_raw: set[tuple[str, int]] = set()
    for case in cases:
        for system in systems:
            if system == "raytrain" and case.key not in ray_cases:
                continue
            if system == "raw":
                if (case.storage, case.size_mb) in seen_raw:
                    continue
                seen_raw.add((case.storage, case.size_mb))
            order.append((system, case))
    return order


# --------------------------------------------------------------------------- summary


def summarize(rec: Record) -> Record:
    """Per-run medians and maxima (seconds)."""
    if not rec["ok"]:
        return {}
    if rec["system"] == "raw":
        raw = rec.get("raw", {})
        out = {f"{k}_med": median(v) for k, v in raw.items()}
        out.update({f"{k}_max": max(v) for k, v in raw.items() if v})
        out["fit_s"] = rec["fit_s"]
        return out
    blocked = rec.get("blocked_s", [])
    latency = [c["t_commit"] - c["t_report"] for c in rec.get("commits", [])]
    return {
        "blocked_med": median(blocked),
        "blocked_min": min(blocked) if blocked else None,
        "blocked_max": max(blocked) if blocked else None,
        "committed_med": median(latency),
        "committed_max": max(latency) if latency else None,
        "n_reports": len(blocked),
        "n_committed": len(latency),
        "n_left": len(rec.get("checkpoints_left", {})),
        "fit_s": rec["fit_s"],
        "loop_s": rec.get("loop_s"),
        "payload_s": rec.get("payload_s"),
        "fit_to_first_line_s": _diff(rec, "t_first", "t_fit"),
        "loop_end_to_fit_end_s": _diff(rec, "t_end", "t_done"),
    }


def _diff(rec: Record, a: str, b: str) -> float | None:
    return rec[a] - rec[b] if rec.get(a) is not None and rec.get(b) is not None else None


FLOOR = {"local": "write_fsync_s", "xfs": "write_fsync_s", "s3": "s3fs_put_s"}
MOVE_FLOOR = "rename_s"  # what a report that may move the files (or queue them) is held to
TARGET_BLOCKED_S = 0.005  # same filesystem, and async: report() blocked <= 5 ms
TARGET_THROUGHPUT = 0.9  # cross-filesystem (xfs, s3 sync): >= 0.9x the floor's throughput


def _moves(case: Case) -> bool:
    """Whether report() may only move (or queue) the files: B4's ≤ 5 ms blocked target."""
    return case.mode in ("async", "asynckeep") or (case.mode, case.storage) == ("syncdel", "local")


def _raw_floor(case: Case) -> tuple[str, str]:
    """(blocked floor, committed floor) metric names of the raw run for a case.

    A SYNC copy: the disk floor, write + fsync of the same bytes from memory (local, xfs), or
    an s3fs put_file (s3). A report that may move the files aside or queue them: a rename.
    """
    blocked = MOVE_FLOOR if _moves(case) else FLOOR[case.storage]
    committed = MOVE_FLOOR if (case.storage, case.mode) == ("local", "syncdel") else None
    return f"{blocked}_med", f"{committed or FLOOR[case.storage]}_med"


def _target(row: Record) -> str:
    """B4's target for phalanx in this case, and whether the medians meet it."""
    case = Case.parse(row["case"])
    blocked = row["phalanx_blocked_med"]
    if blocked is None:
        return "-"
    if _moves(case):
        ok = blocked <= TARGET_BLOCKED_S
        return f"blocked ≤ 5 ms: {'yes' if ok else '**no**'}"
    ratio = row["ratio_raw_blocked"]
    if ratio is None:
        return "-"
    ok = 1 / ratio >= TARGET_THROUGHPUT
    return f"≥ 0.9x floor: {'yes' if ok else '**no**'} ({1 / ratio:.2f}x)"


def _raw_for(runs: list[Record], case: Case) -> dict[int, Record]:
    return {
        r["rep"]: r["summary"]
        for r in runs
        if r.get("sut") == "raw" and r["ok"]
        for c in [Case.parse(r["case"])]
        if (c.storage, c.size_mb) == (case.storage, case.size_mb)
    }


def _by_rep(runs: list[Record], system: str, case: Case) -> dict[int, Record]:
    if system == "raw":
        return _raw_for(runs, case)
    return {
        r["rep"]: r["summary"]
        for r in runs
        if r.get("sut") == system and r.get("case") == case.key and r["ok"]
    }


def _metric(by_rep: dict[int, Record], name: str) -> dict[int, float]:
    return {k: v[name] for k, v in by_rep.items() if v.get(name) is not None}


def _pair(a: dict[int, float], b: dict[int, float]) -> float | None:
    return median([a[k] / b[k] for k in a.keys() & b.keys() if b[k] > 0])


def case_table(runs: list[Record], case: Case) -> Record:
    phx, ray = _by_rep(runs, "phalanx", case), _by_rep(runs, "raytrain", case)
    raw = _by_rep(runs, "raw", case)
    raw_blocked, raw_committed = _raw_floor(case)
    row: Record = {"case": case.key, "n": {"phalanx": len(phx), "raytrain": len(ray)}}
    row["n"]["raw"] = len(raw)
    for label, by in (("phalanx", phx), ("raytrain", ray)):
        for m in ("blocked_med", "committed_med", "fit_s"):
            row[f"{label}_{m}"] = median(list(_metric(by, m).values()))
        maxes = list(_metric(by, "blocked_max").values())
        row[f"{label}_blocked_max"] = max(maxes) if maxes else None
        mins = list(_metric(by, "blocked_min").values())
        row[f"{label}_blocked_min"] = min(mins) if mins else None
    row["raw_blocked"] = median(list(_metric(raw, raw_blocked).values()))
    row["raw_committed"] = median(list(_metric(raw, raw_committed).values()))
    row["raw_blocked_metric"], row["raw_committed_metric"] = raw_blocked, raw_committed
    row["raw_write_fsync"] = median(list(_metric(raw, "write_fsync_s_med").values()))
    for m in ("blocked_med", "committed_med", "fit_s"):
        row[f"ratio_ray_{m}"] = _pair(_metric(phx, m), _metric(ray, m))
    row["ratio_raw_blocked"] = _pair(_metric(phx, "blocked_med"), _metric(raw, raw_blocked))
    row["ratio_raw_committed"] = _pair(_metric(phx, "committed_med"), _metric(raw, raw_committed))
    row["ratio_copytree_blocked"] = _pair(
        _metric(phx, "blocked_med"), _metric(raw, "copytree_s_med")
    )
    return row


# --------------------------------------------------------------------------- report


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    ms = v * 1e3
    if ms < 1:
        return f"{ms:.3f}"
    return f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _x(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}x" if v >= 0.01 else f"{v:.4f}x"


TABLE_HEAD = (
    "| storage | size | mode | blocked med (ms) phalanx / Ray / raw "
    "| blocked min..max (ms) phalanx / Ray "
    "| committed med (ms) phalanx / Ray / raw | fit() (s) phalanx / Ray | phalanx/Ray blocked "
    "| phalanx/Ray committed | phalanx/Ray fit() | phalanx/raw blocked | phalanx/raw committed "
    "| phalanx/copytree blocked | B4 target (phalanx) |"
)


def _range(row: Record, system: str) -> str:
    lo, hi = row[f"{system}_blocked_min"], row[f"{system}_blocked_max"]
    return "-" if lo is None else f"{_ms(lo)}..{_ms(hi)}"


def _table_line(row: Record) -> str:
    storage, size, mode = row["case"].split(":")
    cells = [
        storage,
        f"{size} MB",
        mode,
        " / ".join(
            _ms(row[k]) for k in ("phalanx_blocked_med", "raytrain_blocked_med", "raw_blocked")
        ),
        " / ".join(_range(row, s) for s in ("phalanx", "raytrain")),
        " / ".join(
            _ms(row[k])
            for k in ("phalanx_committed_med", "raytrain_committed_med", "raw_committed")
        ),
        " / ".join(_s(row[k]) for k in ("phalanx_fit_s", "raytrain_fit_s")),
        _x(row["ratio_ray_blocked_med"]),
        _x(row["ratio_ray_committed_med"]),
        _x(row["ratio_ray_fit_s"]),
        _x(row["ratio_raw_blocked"]),
        _x(row["ratio_raw_committed"]),
        _x(row["ratio_copytree_blocked"]),
        _target(row),
    ]
    return "| " + " | ".join(cells) + " |"


def _raw_lines(runs: list[Record], cases: list[Case]) -> list[str]:
    lines = [
        "| storage | size | write (ms) | fsync (ms) | write+fsync (ms) | shutil.copytree (ms) "
        "| rename (ms) | copy tmpfs→disk+fsync (ms) | s3fs put_file (ms) |",
        "| --- " * 9 + "|",
    ]
    seen: set[tuple[str, int]] = set()
    metrics = ("write_s", "fsync_s", "write_fsync_s", "copytree_s", "rename_s", "copy_fsync_s")
    metrics += ("s3fs_put_s",)
    for case in cases:
        if (case.storage, case.size_mb) in seen:
            continue
        seen.add((case.storage, case.size_mb))
        raw = _raw_for(runs, case)
        cells = [_ms(median(list(_metric(raw, f"{m}_med").values()))) for m in metrics]
        lines.append(f"| {case.storage} | {case.size_mb} MB | " + " | ".join(cells) + " |")
    return lines


PHASES = (
    ("fit_to_first_line_s", "fit() → first line"),
    ("payload_s", "make payload (rank 0)"),
    ("loop_s", "training loop (rank 0)"),
    ("loop_end_to_fit_end_s", "loop end → fit() returns"),
    ("fit_s", "fit() total"),
)


def _phase_lines(runs: list[Record], cases: list[Case]) -> list[str]:
    """Where fit() time goes, per case and system (medians over reps, seconds)."""
    lines = ["| case | system | " + " | ".join(label for _, label in PHASES) + " |"]
    lines.append("| --- " * (len(PHASES) + 2) + "|")
    for case in cases:
        for system in ("phalanx", "raytrain"):
            by = _by_rep(runs, system, case)
            if not by:
                continue
            cells = [_s3(median(list(_metric(by, m).values()))) for m, _ in PHASES]
            lines.append(f"| {case.key} | {system} | " + " | ".join(cells) + " |")
    return lines


def _s3(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _checks(runs: list[Record]) -> list[str]:
    out = []
    for r in runs:
        s = r.get("summary", {})
        if not r["ok"] or r["sut"] == "raw":
            continue  # the harness lists every failed run after the report
        expected = STEPS // CKPT_EVERY
        if s.get("n_committed") != expected or s.get("n_left") != min(expected, NUM_TO_KEEP):
            out.append(
                f"- {r['system']} rep {r['rep']}: {s.get('n_committed')} commits "
                f"seen (expected {expected}), {s.get('n_left')} checkpoints left in storage "
                f"(expected {min(expected, NUM_TO_KEEP)})"
            )
        if r.get("leftover"):
            out.append(f"- {r['system']} rep {r['rep']}: leftover {r['leftover']}")
    return out or ["- every run committed every checkpoint and kept exactly num_to_keep=3"]


def workload(meta: Record) -> list[str]:
    return [
        f"- the local storage under {meta['tmp_root']}; shared machine, noisy",
        f"- loop: 2 workers, {STEPS} steps of {STEP_S * 1e3:.0f} ms busy work, rank 0 reports a "
        f"checkpoint (one file `model.bin`) every {CKPT_EVERY} steps ({STEPS // CKPT_EVERY} "
        f"checkpoints), CheckpointConfig(num_to_keep={NUM_TO_KEEP}); the write of the file is "
        "not timed. phalanx: every rank reports every step; Ray Train: every rank reports at "
        "the checkpoint steps only.",
        "- blocked: rank 0's report() call with a checkpoint (per-run median, then median "
        "over reps; min..max = best and worst call over all reps). committed: report() call "
        "start → the driver callback's after_report with the checkpoint (Ray: runs in the "
        "controller actor). Ratios: median over reps of per-rep ratios.",
        "- modes: sync = SYNC (the directory is copied and left as written); syncdel = SYNC "
        "with delete_local_checkpoint_after_upload=True (the files may move); async = ASYNC "
        "(delete defaults to True); asynckeep = ASYNC with delete=False (read in the "
        "background). Same settings for Ray Train.",
        "- raw floor (one process, no framework): blocked = write + fsync of the same bytes "
        "from memory (sync; the disk floor a copy is held to), rename (syncdel on local, and "
        "every async case), s3fs put_file (s3 sync); committed = write + fsync (local, xfs; "
        "rename for local syncdel), s3fs put_file (s3). phalanx/copytree: SYNC blocked vs a "
        "plain shutil.copytree (no fsync) of the same directory into storage. B4 target "
        "column: a report that may move or queue the files (syncdel local, async, asynckeep): "
        "median blocked ≤ 5 ms; a copy (sync, and syncdel across filesystems): throughput "
        "≥ 0.9x the floor, i.e. floor / phalanx ≥ 0.9 (median of per-rep ratios).",
        "- Ray Train: `ray.init(address='local', num_cpus=2)` per run, V2 DataParallelTrainer, "
        "default settings; ASYNC via `checkpoint_upload_mode=CheckpointUploadMode.ASYNC` "
        "(exists in 2.60); its directory outlives report() (`tempfile.mkdtemp`). Ray Train "
        f"runs only the cases {meta['ray_cases']} (~70 s per run here). S3: one moto_server in "
        "its own process on 127.0.0.1 for every run; phalanx gets an s3fs.S3FileSystem, Ray "
        "Train the same s3fs through pyarrow's PyFileSystem(FSSpecHandler(...)) (pyarrow's "
        "native S3FileSystem fails CompleteMultipartUpload against moto 5.2.1).",
    ]


def report(runs: list[Record], meta: Record) -> list[str]:
    cases = _cases_of(meta)
    rows = [case_table(runs, c) for c in cases]
    lines = [
        "## Results",
        "",
        TABLE_HEAD,
        "| --- " * 14 + "|",
        *(_table_line(r) for r in rows),
        "",
        "## Raw floor details (median over reps of per-run medians)",
        "",
        *_raw_lines(runs, cases),
        "",
        "## Where fit() time goes (s, medians over reps)",
        "",
        *_phase_lines(runs, cases),
        "",
        "## Checks",
        "",
        *_checks(runs),
        "",
    ]
    if meta.get("note"):
        lines += ["## Notes", "", *meta["note"].split(" | "), ""]
    return lines


def _cases_of(meta: Record) -> list[Case]:
    """The cases, in the order the runs named them."""
    keys: list[str] = []
    for name in meta["systems"]:
        key = _parse_name(name)[1].key
        keys += [key] if key not in keys else []
    return [Case.parse(k) for k in keys]


# --------------------------------------------------------------------------- main


def _with_sizes(cases: list[Case], sizes: str | None) -> list[Case]:
    """``--sizes``: every case at each given size instead of its own (order kept, no repeats)."""
    if not sizes:
        return cases
    out: list[Case] = []
    for case in cases:
        for size in (int(x) for x in sizes.split(",") if x):
            new = Case(case.storage, size, case.mode)
            if new not in out:
                out.append(new)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", default=DEFAULT_CASES, help="STORAGE:SIZE_MB:MODE,...")
    p.add_argument("--ray-cases", default=DEFAULT_RAY_CASES, help="the cases Ray Train runs")
    p.add_argument("--sizes", help="MB,... replacing every case's size (e.g. 8 for a smoke run)")
    p.add_argument("--tmp-root", default="/tmp", help="where the local storage lives")
    p.add_argument("--note", help="a line for the Notes section (' | ' between lines)")
    p.add_argument("--s3-port", type=int, default=0, help=argparse.SUPPRESS)


BENCH = harness.Bench(
    name="checkpoint",
    title="phalanx benchmark B4 (checkpoint cost)",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    ok=lambda rec: rec.get("error") is None,
    extra_versions=("s3fs", "fsspec", "moto", "boto3", "pyarrow", "numpy"),
    reps=3,
    timeout_s=300.0,
    marked=True,
    named_by_workload=True,
)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    args = harness.parse_args(BENCH)
    # SIGTERM/SIGINT (also when started in the background) clean up: children, moto, files.
    signal.signal(signal.SIGTERM, _interrupt)
    if args.one or args.render:
        harness.main(BENCH, args)
        return
    # --systems names the systems; each runs on the cases of the plan (raw once per storage
    # and size, Ray Train on --ray-cases only), a case's systems one after another.
    systems = [s for s in args.systems.split(",") if s]
    cases = _with_sizes([Case.parse(c) for c in args.cases.split(",") if c], args.sizes)
    ray_cases = {
        c.key
        for c in _with_sizes([Case.parse(c) for c in args.ray_cases.split(",") if c], args.sizes)
    }
    args.systems = ",".join(
        _name(system, case) for system, case in _plan(cases, systems, ray_cases)
    )
    args.ray_cases = ",".join(c.key for c in cases if c.key in ray_cases)
    logs = Path(tempfile.mkdtemp(prefix="b4-logs-", dir=args.tmp_root))
    try:
        with moto_server(any(c.storage == "s3" for c in cases), logs) as port:
            args.s3_port = port
            harness.main(BENCH, args)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()

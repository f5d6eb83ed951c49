#!/usr/bin/env python
"""B3 with the progress view: does the view slow ``report()``?

Run from the repository root:

    python bench/report_progress.py                     # 5 reps, 2,000 steps
    python bench/report_progress.py --reps 1 --steps 50 # smoke run

Two settings, interleaved A B A B ... in fresh subprocesses: ``verbose=0`` (no view, no log
lines) and ``verbose=1`` (the default: the status line, redrawn on every committed round and
twice a second). The driver's output is a pseudo-terminal, so the view really draws. Each run:
2 local workers, ``--steps`` steps of 1 ms busy work with ``report()`` every step; rank 0 times
each call. Results go to bench/results/report_progress.{md,json}: p50/p99 per setting (median
over reps) and the run's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import machine, median, spin, versions

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
SETTINGS = {"verbose0": 0, "view": 1}
BUSY_S = 0.001


def one(verbose: int, steps: int) -> None:
    """In the subprocess: one run; prints its JSON record on the last line."""
    import phalanx
    from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

    def loop(config: dict[str, Any]) -> list[float]:
        times = []
        for step in range(config["steps"]):
            spin(BUSY_S)
            start = time.perf_counter()
            phalanx.report({"loss": 1.0 / (step + 1), "step": step})
            times.append(time.perf_counter() - start)
        return times

    with tempfile.TemporaryDirectory() as storage:
        started = time.perf_counter()
        result = DataParallelTrainer(
            loop,
            train_loop_config={"steps": steps},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="bench", storage_path=storage, verbose=verbose),
        ).fit()
        wall = time.perf_counter() - started
    times = sorted(result.return_value)
    record = {
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[-max(1, len(times) // 100)],
    }
    print("\nRECORD " + json.dumps({**record, "wall_s": wall}), flush=True)


def run_in_pty(setting: str, steps: int) -> dict[str, Any]:
    master, slave = pty.openpty()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    cmd = [sys.executable, __file__, "--one", setting, "--steps", str(steps)]
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, env=env, cwd=REPO)
    os.close(slave)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(master, chunks))
    reader.start()
    proc.wait(timeout=600)
    reader.join(timeout=10)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    line = next((ln for ln in text.splitlines() if ln.startswith("RECORD ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{setting} failed ({proc.returncode}):\n{text[-3000:]}")
    return {"setting": setting, **json.loads(line[len("RECORD ") :])}


def _drain(fd: int, chunks: list[bytes]) -> None:
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return
        if not data:
            return
        chunks.append(data)


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    out = {}
    for setting in SETTINGS:
        mine = [r for r in records if r["setting"] == setting]
        out[setting] = {k: median([r[k] for r in mine]) for k in ("p50_ms", "p99_ms", "wall_s")}
    return out


def write(records: list[dict[str, Any]], args: argparse.Namespace) -> None:
    summary = summarize(records)
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "steps": args.steps,
        "reps": args.reps,
        "summary": summary,
        "records": records,
    }
    (RESULTS / "report_progress.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "# B3 with the progress view",
        "",
        f"{args.steps} steps, report() every step, 2 local workers, {args.reps} reps "
        "(median of per-run p50/p99), driver output on a pseudo-terminal.",
        "",
        "| setting | report() p50 ms | report() p99 ms | wall s |",
        "|---|---|---|---|",
    ]
    for setting, s in summary.items():
        cells = [f"{v:.3f}" if v is not None else "-" for v in s.values()]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    (RESULTS / "report_progress.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--one", choices=sorted(SETTINGS))
    args = parser.parse_args()
    if args.one:
        one(SETTINGS[args.one], args.steps)
        return
    records = []
    for rep in range(args.reps):
        for setting in SETTINGS:  # interleaved, so drift in the machine's load hits both
            record = run_in_pty(setting, args.steps)
            print(f"rep {rep} {setting}: {record}", flush=True)
            records.append(record)
    write(records, args)


if __name__ == "__main__":
    main()

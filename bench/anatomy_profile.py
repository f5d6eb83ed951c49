#!/usr/bin/env python
"""B17c: what ``phalanx profile`` costs the rank it profiles (issue 43: "the step time during a
capture stays within 2 %").

Run from the repository root:

    python bench/anatomy_profile.py                      # 3 reps of 3 windows each
    python bench/anatomy_profile.py --reps 1 --windows 2 --out /tmp/b17c

One system, ``capture``: 2 local DDP workers train a 3-layer MLP (``--width``, batch 64,
``report()`` every step) until told to stop. The driver, in the same process, alternates
``--windows`` times a quiet window of ``--seconds`` and a capture: ``phalanx profile <run>
--rank 0 --seconds S --steps K`` (py-spy at its default 100 Hz, ``--nonblocking``, then a
``torch.profiler`` trace of rank 0's next K steps). Rank 0 notes every step's time, end and
whether torch.profiler was on. Compared, per window pair: the step p50 in the quiet window
against the p50 of the steps that ended inside py-spy's window, and of the steps
torch.profiler recorded (their ratio to the quiet p50; median over every pair).

Results: bench/results/anatomy_profile.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import harness

SYSTEMS = ("capture", "inproc")
WARMUP_STEPS = 20


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    return inproc(args) if args.one == "inproc" else capture(args)


def inproc(args: argparse.Namespace) -> dict[str, Any]:
    """One process, no DDP, the same MLP: finer interleaving than a fit allows. torch.profiler
    on and off in alternate blocks of 10 steps (``--blocks`` pairs; entering and leaving it not
    timed); py-spy (``record --nonblocking`` on this process, 100 Hz) on and off in alternate
    2 s blocks. The step p50 of each side, wall time and the training thread's CPU time (which
    a busy machine's scheduling leaves alone), and their ratio per pair (median over pairs)."""
    import shutil
    import subprocess

    import torch

    model, optimizer, x, y = _model(args.width)

    cpu: list[float] = []  # the training thread's CPU seconds of each step (load aside)

    def step() -> float:
        began, began_cpu = time.perf_counter(), time.thread_time()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        cpu.append(time.thread_time() - began_cpu)
        return time.perf_counter() - began

    def ratio(on: list[float], off: list[float]) -> tuple[float, float]:
        """Wall and CPU p50 ratios of the last ``len(on) + len(off)`` steps (off, then on)."""
        cpu_off, cpu_on = cpu[-len(on) - len(off) : -len(on)], cpu[-len(on) :]
        wall = statistics.median(on) / statistics.median(off)
        return wall, statistics.median(cpu_on) / statistics.median(cpu_off)

    for _ in range(WARMUP_STEPS):
        step()
    traced = []
    for _ in range(args.blocks):
        off = [step() for _ in range(10)]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            on = [step() for _ in range(10)]
        traced.append(ratio(on, off))
    spy = shutil.which("py-spy")
    sampled = []
    with tempfile.TemporaryDirectory() as out:
        for i in range(max(2, args.blocks // 5)):
            ended = time.monotonic() + 2.0
            off = []
            while time.monotonic() < ended:
                off.append(step())
            command = [str(spy), "record", "--pid", str(os.getpid()), "--duration", "2"]
            command += ["--nonblocking", "--output", f"{out}/{i}.svg"]
            recording = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            time.sleep(0.3)  # py-spy attaches
            on = []
            while recording.poll() is None:
                on.append(step())
            sampled.append(ratio(on, off))
    return {
        "traced_x": statistics.median(w for w, _ in traced),
        "traced_cpu_x": statistics.median(c for _, c in traced),
        "pyspy_x": statistics.median(w for w, _ in sampled),
        "pyspy_cpu_x": statistics.median(c for _, c in sampled),
        "traced_pairs": traced,
        "pyspy_pairs": sampled,
    }


def _model(width: int) -> tuple[Any, Any, Any, Any]:
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width),
        torch.nn.ReLU(),
        torch.nn.Linear(4 * width, 4 * width),
        torch.nn.ReLU(),
        torch.nn.Linear(4 * width, width),
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    return module, optimizer, torch.randn(64, width), torch.randn(64, width)


def capture(args: argparse.Namespace) -> dict[str, Any]:
    from phalanx import RunConfig, ScalingConfig
    from phalanx.cli import main as cli_main
    from phalanx.torch import TorchTrainer

    with tempfile.TemporaryDirectory() as storage:
        stop = os.path.join(storage, "stop")
        started = os.path.join(storage, "started")
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"stop": stop, "started": started, "width": args.width},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="b17c", storage_path=storage, verbose=0),
        )
        outcome: list[Any] = []
        runner = threading.Thread(target=lambda: outcome.append(trainer.fit()), daemon=True)
        runner.start()
        deadline = time.monotonic() + 300
        while not os.path.exists(started):
            if time.monotonic() > deadline or not runner.is_alive():
                raise RuntimeError("the run did not start")
            time.sleep(0.1)
        run_dir = os.path.join(storage, "b17c")
        windows: list[tuple[float, float, float, float]] = []
        try:
            for _ in range(args.windows):
                quiet = time.time()
                time.sleep(args.seconds)
                began = time.time()
                seconds, steps = str(args.seconds), str(args.steps)
                code = cli_main(
                    ["profile", run_dir, "--rank", "0", "--seconds", seconds, "--steps", steps]
                )
                if code != 0:
                    raise RuntimeError(f"phalanx profile exited {code}")
                windows.append((quiet, began, began + args.seconds, time.time()))
        finally:
            open(stop, "w").close()
            runner.join(120)
        [result] = outcome
        steps: list[tuple[float, float, bool]] = result.return_value
    pairs = []
    for quiet, began, spied, ended in windows:
        calm = [d for end, d, _ in steps if quiet <= end - d and end <= began]
        during = [d for end, d, on in steps if began <= end - d and end <= spied and not on]
        traced = [d for end, d, on in steps if began <= end - d and end <= ended and on]
        base = statistics.median(calm)
        pairs.append(
            {
                "quiet_ms": 1000 * base,
                "pyspy_ms": 1000 * statistics.median(during) if during else None,
                "traced_ms": 1000 * statistics.median(traced) if traced else None,
                "quiet_steps": len(calm),
                "pyspy_steps": len(during),
                "traced_steps": len(traced),
            }
        )
    ratios = {
        key: statistics.median(p[f"{key}_ms"] / p["quiet_ms"] for p in pairs if p[f"{key}_ms"])
        for key in ("pyspy", "traced")
        if any(p[f"{key}_ms"] for p in pairs)
    }
    return {
        "quiet_ms": statistics.median(p["quiet_ms"] for p in pairs),
        "pyspy_x": ratios.get("pyspy"),
        "traced_x": ratios.get("traced"),
        "pairs": pairs,
    }


def train_loop(config: dict[str, Any]) -> list[tuple[float, float, bool]]:
    import torch

    import phalanx
    from phalanx.torch import prepare_model

    width = config["width"]
    torch.manual_seed(0)
    model = prepare_model(
        torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width),
            torch.nn.ReLU(),
            torch.nn.Linear(4 * width, 4 * width),
            torch.nn.ReLU(),
            torch.nn.Linear(4 * width, width),
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, width), torch.randn(64, width)
    rank = phalanx.get_context().get_world_rank()
    profiling = torch._C._autograd._profiler_enabled
    steps: list[tuple[float, float, bool]] = []
    step = 0
    while True:
        began = time.perf_counter()
        on = bool(profiling())
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        phalanx.report({"step": step})
        done = time.perf_counter()
        steps.append((time.time(), done - began, on))
        step += 1
        if step == WARMUP_STEPS and rank == 0:
            open(config["started"], "w").close()
        if step % 10 == 0 and os.path.exists(config["stop"]):
            return steps[WARMUP_STEPS:]


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    lines = [
        "| rep | window | quiet p50 ms (steps) | during py-spy p50 ms (steps) | ratio | "
        "torch.profiler steps p50 ms (steps) | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rec in runs:
        if not rec["ok"] or rec["system"] != "capture":
            continue
        for i, p in enumerate(rec["pairs"]):

            def cell(key: str, p: dict[str, Any] = p) -> str:
                ms = p[f"{key}_ms"]
                return f"{ms:.2f} ({p[f'{key}_steps']})" if ms else "-"

            def x(key: str, p: dict[str, Any] = p) -> str:
                ms = p[f"{key}_ms"]
                return f"{ms / p['quiet_ms']:.3f}x" if ms else "-"

            lines.append(
                f"| {rec['rep']} | {i} | {cell('quiet')} | {cell('pyspy')} | {x('pyspy')} | "
                f"{cell('traced')} | {x('traced')} |"
            )
    every = [p for rec in runs if rec["ok"] and rec["system"] == "capture" for p in rec["pairs"]]
    for key, what in (("pyspy", "during py-spy"), ("traced", "torch.profiler steps")):
        ratios = [p[f"{key}_ms"] / p["quiet_ms"] for p in every if p[f"{key}_ms"]]
        if ratios:
            lines.append("")
            lines.append(
                f"{what} / quiet, median over {len(ratios)} window pairs: "
                f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"
            )
    inproc = [rec for rec in runs if rec["ok"] and rec["system"] == "inproc"]
    for key, what in (("traced", "torch.profiler"), ("pyspy", "py-spy")):
        pairs = [pair for rec in inproc for pair in rec[f"{key}_pairs"]]
        if pairs:
            wall, cpu = [w for w, _ in pairs], [c for _, c in pairs]
            lines += [
                "",
                f"inproc, {what} on / off in alternate blocks, median over {len(pairs)} pairs: "
                f"step wall time {statistics.median(wall):.3f}x ({min(wall):.3f}-{max(wall):.3f}), "
                f"the training thread's CPU time per step {statistics.median(cpu):.3f}x "
                f"({min(cpu):.3f}-{max(cpu):.3f})",
            ]
    return lines


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- 2 local DDP workers (gloo), a {meta['width']}-{4 * meta['width']}-"
        f"{4 * meta['width']}-{meta['width']} MLP, batch 64, report() every step; "
        f"{meta['windows']} pairs per rep of a {meta['seconds']} s quiet window and "
        f"`phalanx profile --rank 0 --seconds {meta['seconds']} --steps {meta['steps']}`",
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=30, help="inproc: block pairs")


BENCH = harness.Bench.of(
    sys.modules[__name__],
    name="anatomy_profile",
    title="B17c: the step time of a rank during `phalanx profile`",
    systems=SYSTEMS,
    summary_keys=("pyspy_x", "traced_x", "pyspy_cpu_x", "traced_cpu_x"),
    reps=3,
    timeout_s=600.0,
)


if __name__ == "__main__":
    harness.main(BENCH)

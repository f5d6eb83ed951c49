#!/usr/bin/env python
"""B17c: what ``phalanx profile`` costs the rank it profiles (issue 43: "the step time during a
capture stays within 2 %"), on two models.

Run from the repository root:

    python bench/anatomy_profile.py                      # 3 reps, both models
    python bench/anatomy_profile.py --reps 1 --windows 2 --blocks 10 --out /tmp/b17c

Models (``--width`` scales the MLP): ``mlp``, a 256-1024-1024-256 MLP, batch 64, SGD (~170
operators a step, ~10 ms on one core: few, large operators); ``block``, one transformer encoder
layer (d_model 128, 4 heads, feed-forward 512, batch 8 x 32 tokens), AdamW (~900 operators a
step, ~5 ms: what a real step looks like to torch.profiler, many small operators).

Systems, each for both models (``-block``: the transformer):

- ``inproc``: one process, no DDP, one thread, interleaved blocks of 10 steps, off then on, on
  the training thread's CPU time per step (a busy machine's scheduling leaves it alone) and wall
  time; ratio per pair, median over ``--blocks`` pairs. On: ``phalanx`` (the capture
  ``phalanx profile`` takes: a request file, ``ProfileWatch.poll()`` after each step as
  ``report()`` calls it, the trace exported at the end), and, to show where the cost is,
  torch.profiler's ``default`` (no schedule, Python events built at the end: the capture before
  this change), ``shapes`` (record_shapes) and ``stack`` (with_stack); py-spy (100 Hz,
  ``--nonblocking``) on and off in alternate 2 s blocks. Also: operators per step and the cost
  per operator, and the one-off start and stop (stop: end the capture and write the trace, in
  the report() of the last traced step).
- ``capture``: 2 local DDP workers train the model (report() every step) until told to stop;
  the driver alternates ``--windows`` times a quiet window of ``--seconds`` and ``phalanx
  profile <run> --rank 0 --seconds S --steps K``. Per window pair: rank 0's step p50 in the quiet
  window against the p50 of the steps inside py-spy's window and of the steps torch.profiler
  recorded (median over pairs). Wall time of a 2-rank fit: noisy under load (see inproc).

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
from collections.abc import Callable
from typing import Any

import harness

SYSTEMS = ("inproc", "inproc-block", "capture", "capture-block")
WARMUP_STEPS = 20
BLOCK = 10  # steps per on or off block (inproc)
VARIANTS = ("phalanx", "default", "shapes", "stack")


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    kind = "block" if args.one.endswith("-block") else "mlp"
    return inproc(args, kind) if args.one.startswith("inproc") else capture(args, kind)


def build(kind: str, width: int, prepare: Callable[[Any], Any] = lambda m: m) -> Callable[[], None]:
    """One training step of the model ``kind`` (forward, backward, optimizer step)."""
    import torch

    torch.manual_seed(0)
    if kind == "block":
        layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
        model = prepare(layer)
        optimizer: Any = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randn(8, 32, 128)

        def loss() -> Any:
            return model(tokens).pow(2).mean()

    else:
        model = prepare(
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

        def loss() -> Any:
            return torch.nn.functional.mse_loss(model(x), y)

    def step() -> None:
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()

    return step


class Steps:
    """One process's training steps, each step's CPU time (the training thread's: a busy
    machine's scheduling leaves it alone) and wall time."""

    def __init__(self, train: Callable[[], None]) -> None:
        self.train = train
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def step(self, after: Callable[[], None] = lambda: None) -> None:
        began, began_cpu = time.perf_counter(), time.thread_time()
        self.train()
        after()
        self.cpu.append(time.thread_time() - began_cpu)
        self.wall.append(time.perf_counter() - began)

    def ratios(self, n_on: int, n_off: int) -> tuple[float, float, float]:
        """CPU and wall p50 ratios, and the CPU p50 added (s), of the last ``n_off`` steps
        (off) and the ``n_on`` steps (on) after them."""
        cpu, wall = self.cpu, self.wall
        c_off, c_on = statistics.median(cpu[-n_on - n_off : -n_on]), statistics.median(cpu[-n_on:])
        w_off, w_on = (
            statistics.median(wall[-n_on - n_off : -n_on]),
            statistics.median(wall[-n_on:]),
        )
        return c_on / c_off, w_on / w_off, c_on - c_off


def inproc(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """See the module's docstring: ``inproc``."""
    import json

    import torch

    from phalanx._internal.worker.profiling import ProfileWatch, trace_path

    steps = Steps(build(kind, args.width))
    for _ in range(WARMUP_STEPS):
        steps.step()
    profiler = torch.profiler
    cpu_only = [profiler.ProfilerActivity.CPU]
    plain: dict[str, Callable[[], Any]] = {
        "default": lambda: profiler.profile(activities=cpu_only),
        "shapes": lambda: profiler.profile(activities=cpu_only, record_shapes=True),
        "stack": lambda: profiler.profile(activities=cpu_only, with_stack=True),
    }
    pairs: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
    ends: list[tuple[float, float]] = []  # the phalanx capture's start and stop, ms
    with tempfile.TemporaryDirectory() as run_dir:
        os.makedirs(os.path.join(run_dir, "profile"))
        watch = ProfileWatch(run_dir, 0)
        for block in range(args.blocks):
            for variant in VARIANTS:
                for _ in range(BLOCK):
                    steps.step()
                if variant == "phalanx":
                    ends.append(_phalanx_capture(steps, watch, run_dir, str(block)))
                else:
                    with plain[variant]():
                        for _ in range(BLOCK):
                            steps.step()
                pairs[variant].append(steps.ratios(BLOCK, BLOCK))
        with open(trace_path(run_dir, 0, "0")) as f:
            events = json.load(f)["traceEvents"]
    operators = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    marks = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    sampled = _pyspy_pairs(steps)
    per_step = len(operators) / BLOCK
    return {
        "model": kind,
        "step_ms": 1000 * statistics.median(steps.cpu[:WARMUP_STEPS]),
        "operators_per_step": per_step,
        "step_marks": len(marks),
        "us_per_operator": 1e6 * statistics.median(a for _, _, a in pairs["phalanx"]) / per_step,
        "start_ms": statistics.median(a for a, _ in ends),
        "stop_ms": statistics.median(b for _, b in ends),
        **{f"{v}_cpu_x": statistics.median(c for c, _, _ in pairs[v]) for v in VARIANTS},
        **{f"{v}_wall_x": statistics.median(w for _, w, _ in pairs[v]) for v in VARIANTS},
        "traced_cpu_x": statistics.median(c for c, _, _ in pairs["phalanx"]),
        "pyspy_cpu_x": statistics.median(c for c, _, _ in sampled),
        "pyspy_wall_x": statistics.median(w for _, w, _ in sampled),
        "pairs": pairs,
        "pyspy_pairs": sampled,
    }


def _phalanx_capture(
    steps: Steps, watch: Any, run_dir: str, request_id: str
) -> tuple[float, float]:
    """``BLOCK`` steps under the capture ``phalanx profile`` asks for, polled after each step as
    report() polls; the capture's start and stop (ms), each out of the steps' own times."""
    import json

    from phalanx._internal.worker.profiling import request_path, trace_path

    with open(request_path(run_dir, 0), "w") as f:
        json.dump({"id": request_id, "steps": BLOCK}, f)
    watch._next_check = 0.0  # report() looks at most once a second
    began = time.perf_counter()
    watch.poll()  # starts the capture (in the report() before the first traced step)
    started = time.perf_counter() - began
    for _ in range(BLOCK - 1):
        steps.step(watch.poll)
    stop = [0.0, 0.0]

    def last() -> None:  # the last traced step's report() ends the capture, writes the trace
        began, began_cpu = time.perf_counter(), time.thread_time()
        watch.poll()
        stop[:] = time.perf_counter() - began, time.thread_time() - began_cpu

    steps.step(last)
    steps.wall[-1] -= stop[0]
    steps.cpu[-1] -= stop[1]
    if not os.path.exists(trace_path(run_dir, 0, request_id)):
        raise RuntimeError("phalanx's capture wrote no trace")
    return 1000 * started, 1000 * stop[0]


def _pyspy_pairs(steps: Steps) -> list[tuple[float, float, float]]:
    """py-spy (``record --nonblocking`` on this process, 100 Hz) off and on in 2 s blocks."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy")
    sampled = []
    with tempfile.TemporaryDirectory() as out:
        for i in range(2):
            ended, n_off = time.monotonic() + 2.0, len(steps.cpu)
            while time.monotonic() < ended:
                steps.step()
            n_off = len(steps.cpu) - n_off
            command = [str(spy), "record", "--pid", str(os.getpid()), "--duration", "2"]
            command += ["--nonblocking", "--output", f"{out}/{i}.svg"]
            recording = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            time.sleep(0.3)  # py-spy attaches
            n_on = len(steps.cpu)
            while recording.poll() is None:
                steps.step()
            sampled.append(steps.ratios(len(steps.cpu) - n_on, n_off))
    return sampled


def capture(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    from phalanx import RunConfig, ScalingConfig
    from phalanx.cli import main as cli_main
    from phalanx.torch import TorchTrainer

    with tempfile.TemporaryDirectory() as storage:
        stop = os.path.join(storage, "stop")
        started = os.path.join(storage, "started")
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={
                "stop": stop,
                "started": started,
                "width": args.width,
                "model": kind,
            },
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
        "model": kind,
        "quiet_ms": statistics.median(p["quiet_ms"] for p in pairs),
        "pyspy_x": ratios.get("pyspy"),
        "traced_x": ratios.get("traced"),
        "pairs": pairs,
    }


def train_loop(config: dict[str, Any]) -> list[tuple[float, float, bool]]:
    import torch

    import phalanx
    from phalanx.torch import prepare_model

    train = build(config["model"], config["width"], prepare_model)
    rank = phalanx.get_context().get_world_rank()
    profiling = torch._C._autograd._profiler_enabled
    steps: list[tuple[float, float, bool]] = []
    step = 0
    while True:
        began = time.perf_counter()
        on = bool(profiling())
        train()
        phalanx.report({"step": step})
        done = time.perf_counter()
        steps.append((time.time(), done - began, on))
        step += 1
        if step == WARMUP_STEPS and rank == 0:
            open(config["started"], "w").close()
        if step % 10 == 0:  # the ranks stop at the same step (else one waits in DDP's next)
            stop = torch.tensor([float(os.path.exists(config["stop"]))])
            torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
            if stop.item():
                return steps[WARMUP_STEPS:]


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for kind in ("mlp", "block"):
        ok = [r for r in runs if r["ok"] and r.get("model") == kind]
        inproc = [r for r in ok if r["system"].startswith("inproc")]
        if inproc:
            lines += [f"## {kind}: one process, on / off in alternate blocks of {BLOCK} steps", ""]
            lines += _inproc_lines(inproc)
        fits = [r for r in ok if r["system"].startswith("capture")]
        if fits:
            lines += [f"## {kind}: `phalanx profile` on rank 0 of a 2-rank fit", ""]
            lines += _capture_lines(fits)
    return lines


def _mid(values: list[float], digits: int = 3, unit: str = "x") -> str:
    if not values:
        return "-"
    return (
        f"{statistics.median(values):.{digits}f}{unit} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def _inproc_lines(recs: list[dict[str, Any]]) -> list[str]:
    """Per variant: the CPU and wall ratios over every pair of every rep."""
    what = {
        "phalanx": "phalanx profile's capture (this change)",
        "default": "torch.profiler default (the capture before)",
        "shapes": "+ record_shapes",
        "stack": "+ with_stack",
    }
    lines = [
        "| capture | CPU per step, on / off | wall per step, on / off |",
        "| --- | --- | --- |",
    ]
    for v in VARIANTS:
        pairs = [p for r in recs for p in r["pairs"][v]]
        lines.append(
            f"| {what[v]} | {_mid([c for c, _, _ in pairs])} | {_mid([w for _, w, _ in pairs])} |"
        )
    spy = [p for r in recs for p in r["pyspy_pairs"]]
    lines.append(
        f"| py-spy 100 Hz (2 s blocks) | {_mid([c for c, _, _ in spy])} | "
        f"{_mid([w for _, w, _ in spy])} |"
    )
    lines += [
        "",
        f"Step {_mid([r['step_ms'] for r in recs], 2, ' ms')} CPU; "
        f"{_mid([r['operators_per_step'] for r in recs], 0, '')} operators per step in the "
        f"trace, {_mid([r['us_per_operator'] for r in recs], 2, ' us')} added per operator; "
        f"{recs[0]['step_marks']} ProfilerStep marks in a {BLOCK}-step trace; the capture's "
        f"start {_mid([r['start_ms'] for r in recs], 2, ' ms')}, its stop and trace export "
        f"{_mid([r['stop_ms'] for r in recs], 1, ' ms')} (once, in the report() of the last "
        "traced step; not in the ratios).",
        "",
    ]
    return lines


def _capture_lines(recs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| rep | window | quiet p50 ms (steps) | during py-spy p50 ms (steps) | ratio | "
        "torch.profiler steps p50 ms (steps) | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rec in recs:
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
    every = [p for rec in recs for p in rec["pairs"]]
    for key, what in (("pyspy", "during py-spy"), ("traced", "torch.profiler steps")):
        ratios = [p[f"{key}_ms"] / p["quiet_ms"] for p in every if p[f"{key}_ms"]]
        if ratios:
            lines += ["", f"{what} / quiet, median over {len(ratios)} window pairs: {_mid(ratios)}"]
    return [*lines, ""]


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- models: mlp {meta['width']}-{4 * meta['width']}-{4 * meta['width']}-"
        f"{meta['width']}, batch 64, SGD; block: a transformer encoder layer (128, 4 heads, 512), "
        "batch 8 x 32 tokens, AdamW; one thread",
        f"- inproc: {meta['blocks']} pairs of {BLOCK}-step blocks per variant; capture: 2 local "
        f"DDP workers (gloo), report() every step, {meta['windows']} pairs per rep of a "
        f"{meta['seconds']} s quiet window and `phalanx profile --rank 0 --seconds "
        f"{meta['seconds']} --steps {meta['steps']}`",
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=20, help="inproc: block pairs")


BENCH = harness.Bench.of(
    sys.modules[__name__],
    name="anatomy_profile",
    title="B17c: the step time of a rank during `phalanx profile`",
    systems=SYSTEMS,
    summary_keys=("traced_cpu_x", "us_per_operator", "pyspy_cpu_x", "traced_x", "pyspy_x"),
    reps=3,
    timeout_s=600.0,
)


if __name__ == "__main__":
    harness.main(BENCH)

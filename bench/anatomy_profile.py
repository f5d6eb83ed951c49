#!/usr/bin/env python
"""B17c: what ``phalanx profile`` costs the rank it profiles (issue 43: "the step time during a
capture stays within 2 %"), on two models: its default capture (py-spy alone) and the opt-in
``--torch`` trace, as separate rows.

Run from the repository root:

    python bench/anatomy_profile.py                      # 3 reps, both models (~8 min loaded)
    python bench/anatomy_profile.py --rates 50,100,20 --spy-pairs 4   # py-spy's rates compared
    python bench/anatomy_profile.py --reps 1 --windows 2 --blocks 10 --out /tmp/b17c

Models (``--width`` scales the MLP): ``mlp``, a 256-1024-1024-256 MLP, batch 64, SGD (~170
operators a step, ~10 ms on one core: few, large operators); ``block``, one transformer encoder
layer (d_model 128, 4 heads, feed-forward 512, batch 8 x 32 tokens), AdamW (~900 operators a
step, ~5 ms: what a real step looks like to torch.profiler, many small operators).

Systems, each for both models (``-block``: the transformer):

- ``inproc``: one process, no DDP, one thread, interleaved blocks of 10 steps, off then on, on
  the training thread's CPU time per step (a busy machine's scheduling leaves it alone) and wall
  time; ratio per pair, median over ``--blocks`` pairs. The default capture: py-spy with
  ``phalanx profile``'s own command (``spy_command``: ``--nonblocking``, Python frames only) at
  each rate of ``--rates`` (the CLI's default, 50 Hz, and py-spy's own, 100), on and off in alternate 2 s blocks,
  ``--spy-pairs`` pairs each. The opt-in ``--torch`` trace: ``phalanx`` (the capture
  ``phalanx profile --torch`` takes: a request file, ``ProfileWatch.poll()`` after each step as
  ``report()`` calls it, the trace exported at the end), and, to show where the cost is,
  torch.profiler's ``default`` (no schedule, Python events built at the end), ``shapes``
  (record_shapes) and ``stack`` (with_stack). Also: operators per step and the cost
  per operator, and the one-off start and stop (stop: end the capture and write the trace, in
  the report() of the last traced step).
- ``capture``: 2 local DDP workers train the model (report() every step) until told to stop;
  the driver runs ``--windows`` times a quiet window of ``--seconds``, ``phalanx profile <run>
  --rank 0 --seconds S`` (the default: py-spy alone) and ``phalanx profile ... --torch --steps
  K`` (the quiet window before the default capture in even windows, after it in odd ones). Per
  window: rank 0's step p50 in the quiet window against the p50 of the steps inside the default
  capture (from ``ATTACH_S`` after its start: py-spy's start-up is once) and of the steps
  torch.profiler recorded (median over windows); and py-spy's own CPU (the driver's children's
  rusage over the capture, start-up included). Wall time of a 2-rank fit: noisy under load (see inproc).

Results: bench/results/anatomy_profile.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import harness

from phalanx.cli._profile import DEFAULT_RATE

SYSTEMS = ("inproc", "inproc-block", "capture", "capture-block")
WARMUP_STEPS = 20
ATTACH_S = 0.3  # py-spy's start-up (it reads the binary's symbols), left out of its window
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
    rates = [int(rate) for rate in args.rates.split(",")]
    sampled = _pyspy_pairs(steps, rates, args.spy_pairs)
    default = sampled[str(rates[0])]
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
        "pyspy_cpu_x": statistics.median(p[0] for p in default),
        "pyspy_wall_x": statistics.median(p[1] for p in default),
        "pyspy_core": statistics.median(p[3] for p in default),
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


def _pyspy_pairs(
    steps: Steps, rates: list[int], pairs: int
) -> dict[str, list[tuple[float, float, float, float]]]:
    """py-spy, with ``phalanx profile``'s own command at each rate, off and on in 2 s blocks on
    this process, the rates interleaved pair by pair: (CPU ratio, wall ratio, CPU added per
    step, py-spy's own CPU seconds per second of capture)."""
    import shutil
    import subprocess

    from phalanx.cli._profile import spy_command

    spy = shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    sampled: dict[str, list[tuple[float, float, float, float]]] = {str(r): [] for r in rates}
    with tempfile.TemporaryDirectory() as out:
        for i in range(pairs):
            for rate in rates:
                ended, n_off = time.monotonic() + 2.0, len(steps.cpu)
                while time.monotonic() < ended:
                    steps.step()
                n_off = len(steps.cpu) - n_off
                command = spy_command(spy, os.getpid(), 2, rate, f"{out}/{rate}-{i}.svg")
                recording = subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                time.sleep(ATTACH_S)  # py-spy attaches
                n_on = len(steps.cpu)
                while True:  # py-spy's own CPU time too: what it takes from a shared core
                    pid, status, usage = os.wait4(recording.pid, os.WNOHANG)
                    if pid:
                        break
                    steps.step()
                recording.returncode = os.waitstatus_to_exitcode(status)
                if recording.returncode != 0:
                    raise RuntimeError(f"py-spy exited {recording.returncode}: {command}")
                cpu, wall, added = steps.ratios(len(steps.cpu) - n_on, n_off)
                sampled[str(rate)].append((cpu, wall, added, (usage.ru_utime + usage.ru_stime) / 2))
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
        windows: list[tuple[float, float, float, float, float, float]] = []
        spy_cpu: list[float] = []  # py-spy's own CPU seconds per second of capture
        base = ["profile", run_dir, "--rank", "0", "--seconds", str(args.seconds)]
        try:
            for i in range(args.windows):
                # the quiet window before the default capture, then after it (order effects)
                if i % 2 == 0:
                    quiet = time.time()
                    time.sleep(args.seconds)
                began = time.time()
                children = resource.getrusage(resource.RUSAGE_CHILDREN)
                if cli_main(base) != 0:  # the default capture: py-spy alone
                    raise RuntimeError("phalanx profile exited non-zero")
                spied, after = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
                used = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
                spy_cpu.append(used / (spied - began))
                if i % 2 == 1:
                    quiet = time.time()
                    time.sleep(args.seconds)
                calm_end = quiet + args.seconds
                torch_began = time.time()
                if cli_main([*base, "--torch", "--steps", str(args.steps)]) != 0:
                    raise RuntimeError("phalanx profile --torch exited non-zero")
                # py-spy's steps from ATTACH_S on: its start-up (reading the binary) is once
                windows.append((quiet, calm_end, began + ATTACH_S, spied, torch_began, time.time()))
        finally:
            open(stop, "w").close()
            runner.join(120)
        [result] = outcome
        steps: list[tuple[float, float, bool]] = result.return_value
    pairs = []
    for quiet, calm_end, began, spied, torch_began, ended in windows:
        calm = [d for end, d, _ in steps if quiet <= end - d and end <= calm_end]
        during = [d for end, d, on in steps if began <= end - d and end <= spied and not on]
        traced = [d for end, d, on in steps if torch_began <= end - d and end <= ended and on]
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
        "pyspy_core": statistics.median(spy_cpu),
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
    """Per capture: the CPU and wall ratios over every pair of every rep; the default capture
    (py-spy alone) first, then the opt-in --torch trace."""
    what = {
        "phalanx": "`--torch`: phalanx profile's torch.profiler capture",
        "default": "`--torch` alternatives: torch.profiler default",
        "shapes": "+ record_shapes",
        "stack": "+ with_stack",
    }
    lines = [
        "| capture | CPU per step, on / off | wall per step, on / off | profiler's own CPU |",
        "| --- | --- | --- | --- |",
    ]
    rates = list(recs[0]["pyspy_pairs"])
    for rate in rates:
        spy = [p for r in recs for p in r["pyspy_pairs"][rate]]
        default = int(rate) == DEFAULT_RATE
        name = f"**default: py-spy {rate} Hz**" if default else f"py-spy {rate} Hz"
        core = _mid([100 * p[3] for p in spy], 1, " % of a core")
        lines.append(
            f"| {name} | {_mid([p[0] for p in spy])} | {_mid([p[1] for p in spy])} | {core} |"
        )
    for v in VARIANTS:
        pairs = [p for r in recs for p in r["pairs"][v]]
        lines.append(
            f"| {what[v]} | {_mid([c for c, _, _ in pairs])} | {_mid([w for _, w, _ in pairs])} "
            "| in the training thread |"
        )
    lines += [
        "",
        "py-spy: `--nonblocking`, Python frames only, on and off in alternate 2 s blocks, the "
        "rates interleaved; its own CPU (its process's user + system time per second of "
        "capture) runs beside the rank: on a host with a core to spare the rank does not pay it.",
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
        "| rep | window | quiet p50 ms (steps) | default capture (py-spy) p50 ms (steps) | ratio | "
        "`--torch` traced steps p50 ms (steps) | ratio |",
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
    for key, what in (("pyspy", "default capture (py-spy)"), ("traced", "`--torch` traced steps")):
        ratios = [p[f"{key}_ms"] / p["quiet_ms"] for p in every if p[f"{key}_ms"]]
        if ratios:
            lines += ["", f"{what} / quiet, median over {len(ratios)} window pairs: {_mid(ratios)}"]
    cores = [100 * rec["pyspy_core"] for rec in recs if rec.get("pyspy_core") is not None]
    lines += [
        "",
        f"py-spy's own CPU during the default capture: {_mid(cores, 1, ' % of a core')} (its "
        f"start-up included; the steps of its first {ATTACH_S} s are left out of its window, and "
        "the quiet window is before the capture in even windows, after it in odd ones)",
    ]
    return [*lines, ""]


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- models: mlp {meta['width']}-{4 * meta['width']}-{4 * meta['width']}-"
        f"{meta['width']}, batch 64, SGD; block: a transformer encoder layer (128, 4 heads, 512), "
        "batch 8 x 32 tokens, AdamW; one thread",
        f"- inproc: py-spy at {meta['rates']} Hz, {meta['spy_pairs']} pairs "
        f"of 2 s blocks per rate; {meta['blocks']} pairs of {BLOCK}-step blocks per torch "
        f"variant; capture: 2 local DDP workers (gloo), report() every step, {meta['windows']} "
        f"windows per rep: {meta['seconds']} s quiet, `phalanx profile --rank 0 --seconds "
        f"{meta['seconds']}`, then the same with `--torch --steps {meta['steps']}`",
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=10, help="inproc: torch block pairs")
    parser.add_argument(
        "--rates",
        default=f"{DEFAULT_RATE},100",
        help="inproc: py-spy rates (Hz), phalanx profile's default first",
    )
    parser.add_argument("--spy-pairs", type=int, default=3, help="inproc: py-spy pairs per rate")


BENCH = harness.Bench.of(
    sys.modules[__name__],
    name="anatomy_profile",
    title="B17c: the step time of a rank during `phalanx profile`",
    systems=SYSTEMS,
    summary_keys=(
        "pyspy_cpu_x",
        "pyspy_core",
        "traced_cpu_x",
        "us_per_operator",
        "pyspy_x",
        "traced_x",
    ),
    reps=3,
    timeout_s=600.0,
)


if __name__ == "__main__":
    harness.main(BENCH)

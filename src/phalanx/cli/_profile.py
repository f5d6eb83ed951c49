"""``phalanx profile <run> --rank R --seconds N [--torch]``: what one rank of a running run is doing.

By default one capture into ``<run>/profile/``: a py-spy flame graph of the rank's process for N
seconds (``rank-R-<id>.svg``). py-spy reads the process's memory from outside without stopping it
(``--nonblocking``), Python frames only (no ``--native``, ``--idle`` or ``--subprocesses``), at
``--rate`` samples a second: the lightest capture that still shows where a step's time goes
(bench/anatomy_profile.py: the step within 2 %). ``--torch`` adds a ``torch.profiler`` trace of
the rank's next ``--steps`` steps (``rank-R-<id>.trace.json``), which the rank starts at its next
``report()`` (``_internal/worker/profiling.py``). It is opt-in because torch.profiler costs about
1 us per operator it records (torch's own, whatever the options): ~3 % of a 10 ms MLP step of
170 operators, ~12 % of a transformer layer's 7 ms step of 900 (B17c, under load). The rank's pid
and host come from ``<run>/profile/workers.json``, written by the driver at each attempt's start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

from phalanx._internal.worker.profiling import (
    declined_path,
    request_path,
    trace_path,
    workers_path,
)
from phalanx.cli._runs import CLIError, open_run

__all__ = ["add_parser", "profile", "spy_command"]

Out = Callable[[str], None]
TRACE_GRACE_S = 30.0  # after the flame graph, how long to wait for the trace's steps
# py-spy's samples per second: 500 in a 10 s capture; py-spy's own CPU ~2.7 % of a core beside the
# rank (100 Hz, py-spy's default: ~4.5 %); the training thread's step alike at 20-100 Hz (B17c)
DEFAULT_RATE = 50
# Trainers whose training function does not use torch: --torch is refused up front for them.
NOT_TORCH = (
    "XGBoostTrainer",
    "LightGBMTrainer",
    "SklearnTrainer",
    "JaxTrainer",
    "TensorflowTrainer",
)
TORCH_HELP = (
    "also a torch.profiler trace of the rank's next --steps steps (opt-in: torch.profiler costs "
    "~1 us per operator it records, e.g. 3 %% of a 10 ms MLP step, 12 %% of a 7 ms transformer "
    "layer's step; py-spy alone stays within 2 %%)"
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "profile",
        help="a py-spy flame graph of one running rank (--torch: and a torch.profiler trace)",
        description="A py-spy flame graph of one running rank into <run>/profile/ (py-spy "
        "--nonblocking, Python frames only: the step time within 2 %); with --torch, also a "
        "torch.profiler trace of its next steps.",
    )
    parser.add_argument("run")
    parser.add_argument("--rank", type=int, default=0, help="the rank to profile (default 0)")
    parser.add_argument("--seconds", type=int, default=10, help="py-spy's capture, whole seconds")
    parser.add_argument("--torch", action="store_true", help=TORCH_HELP)
    parser.add_argument("--steps", type=int, help="--torch: steps in the trace (default 10)")
    parser.add_argument(
        "--rate",
        type=int,
        default=DEFAULT_RATE,
        help=f"py-spy's samples per second ({DEFAULT_RATE})",
    )


def spy_command(spy: str, pid: int, seconds: int, rate: int, output: str) -> list[str]:
    """The py-spy command of a capture (bench/anatomy_profile.py measures this one)."""
    command = [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate)]
    return [*command, "--nonblocking", "--format", "flamegraph", "--output", output]


def profile(args: argparse.Namespace, out: Out) -> None:
    if args.steps is not None and not args.torch:
        raise CLIError(
            f"phalanx profile --steps {args.steps}: --steps is the length of the torch.profiler "
            "trace, which only --torch takes.\nHINT: phalanx profile <run> --torch --steps "
            f"{args.steps} (or leave --steps out for the py-spy flame graph alone)"
        )
    args.steps = 10 if args.steps is None else args.steps
    if args.seconds <= 0 or args.steps <= 0 or args.rate <= 0:
        raise CLIError(
            f"phalanx profile --seconds {args.seconds} --steps {args.steps} --rate {args.rate}: "
            "each must be > 0.\nHINT: phalanx profile <run> --rank 0 --seconds 10"
        )
    run = open_run(args.run)
    run_dir = run.storage.local_path
    if run_dir is None:
        raise CLIError(
            f"run {run.name} is on remote storage ({run.uri}): phalanx profile reads and writes "
            "its files on the driver's host.\nHINT: run phalanx profile on the driver's host, "
            "with the run's storage_path there."
        )
    trainer = str(run.config.get("trainer", {}).get("type", ""))
    if args.torch and trainer.rsplit(".", 1)[-1] in NOT_TORCH:
        raise CLIError(
            f"phalanx profile --torch: run {run.name} is trained by {trainer}, which does not use "
            "torch: there is no torch.profiler trace to take.\nHINT: leave out --torch (the "
            "py-spy flame graph shows any Python training function)."
        )
    worker = _worker(run_dir, args.rank, run.name)
    spy = shutil.which("py-spy")
    if spy is None:
        raise CLIError("phalanx profile needs py-spy.\nHINT: pip install py-spy")
    request = request_path(run_dir, args.rank)
    request_id = _new_id(os.path.dirname(request), args.rank)
    if args.torch:
        with open(request + ".tmp", "w") as f:
            json.dump({"id": request_id, "steps": args.steps}, f)
        os.replace(request + ".tmp", request)
    flame = os.path.join(os.path.dirname(request), f"rank-{args.rank}-{request_id}.svg")
    also = f", and its next {args.steps} steps with torch.profiler" if args.torch else ""
    out(
        f"profiling rank {args.rank} (pid {worker['pid']} on {worker['host']}) for "
        f"{args.seconds} s{also} ..."
    )
    command = spy_command(spy, int(worker["pid"]), args.seconds, args.rate, flame)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not os.path.exists(flame):
        _withdraw(request)
        raise CLIError(
            f"py-spy could not profile pid {worker['pid']}: {(done.stderr or done.stdout).strip()}"
            "\nHINT: py-spy needs the right to trace the process (run as the same user, or "
            "with sudo; in a container, --cap-add SYS_PTRACE)."
        )
    out(f"wrote {flame}")
    if args.torch:
        _wait_for_trace(run_dir, args, request, request_id, int(worker["pid"]), out)


def _wait_for_trace(
    run_dir: str, args: argparse.Namespace, request: str, request_id: str, pid: int, out: Out
) -> None:
    trace = trace_path(run_dir, args.rank, request_id)
    declined = declined_path(run_dir, args.rank, request_id)
    deadline = time.monotonic() + TRACE_GRACE_S
    while not os.path.exists(trace) and time.monotonic() < deadline:
        if not _alive(pid) or os.path.exists(declined):
            break
        time.sleep(0.2)
    if os.path.exists(trace):
        out(f"wrote {trace}")
        return
    taken = not os.path.exists(request)
    _withdraw(request)
    if os.path.exists(declined):
        _withdraw(declined)
        raise CLIError(
            f"phalanx profile --torch: rank {args.rank}'s training function does not use torch "
            "(torch is not imported in its process): no torch.profiler trace (the flame graph "
            "above was written).\nHINT: leave out --torch for a training function without torch."
        )
    out(
        "no torch.profiler trace: "
        + (
            f"rank {args.rank} did not finish {args.steps} steps in time"
            if taken
            else f"rank {args.rank} did not report() since the request"
        )
    )


def _worker(run_dir: str, rank: int, name: str) -> dict[str, Any]:
    try:
        with open(workers_path(run_dir)) as f:
            workers = json.load(f)["workers"]
    except (OSError, ValueError, KeyError) as exc:
        raise CLIError(
            f"run {name} has no running workers to profile ({workers_path(run_dir)}: {exc}).\n"
            "HINT: phalanx profile works while a run's training is running."
        ) from None
    if not 0 <= rank < len(workers):
        raise CLIError(
            f"run {name} has ranks 0-{len(workers) - 1}: there is no rank {rank}.\n"
            f"HINT: --rank between 0 and {len(workers) - 1}"
        )
    worker: dict[str, Any] = workers[rank]
    if not _this_host(str(worker.get("host"))):
        raise CLIError(
            f"rank {rank} of run {name} runs on host {worker.get('host')}, not here "
            f"({socket.gethostname()}): py-spy reads a process of its own host.\nHINT: run "
            f"phalanx profile on {worker.get('host')} (the run directory must be there too)."
        )
    if not isinstance(worker.get("pid"), int) or not _alive(worker["pid"]):
        raise CLIError(
            f"rank {rank} of run {name} (pid {worker.get('pid')}) is not running.\n"
            "HINT: phalanx profile works while a run's training is running."
        )
    return worker


def _new_id(profile_dir: str, rank: int) -> str:
    """The capture's id: its time, with a count after it if a capture of that second exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    taken = set(os.listdir(profile_dir)) if os.path.isdir(profile_dir) else set()
    request_id, n = stamp, 1
    while any(name.startswith(f"rank-{rank}-{request_id}.") for name in taken):
        n += 1
        request_id = f"{stamp}-{n}"
    return request_id


def _this_host(host: str) -> bool:
    """``host`` (a name, or an address as Ray gives it) is this machine."""
    if host in (socket.gethostname(), "localhost"):
        return True
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))  # only an address of this machine can be bound
        return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _withdraw(request: str) -> None:
    try:
        os.remove(request)
    except FileNotFoundError:
        pass

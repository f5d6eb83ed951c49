"""``phalanx profile <run> --rank R --seconds N``: what one rank of a running run is doing.

Two captures into ``<run>/profile/``: a py-spy flame graph of the rank's process for N seconds
(``rank-R-<id>.svg``; py-spy samples from outside, without stopping the process:
``--nonblocking``), and, where the training function uses torch, a ``torch.profiler`` trace of
its next ``--steps`` steps (``rank-R-<id>.trace.json``), which the rank starts at its next
``report()`` (``_internal/worker/profiling.py``). The rank's pid and host come from
``<run>/profile/workers.json``, written by the driver at each attempt's start.
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

from phalanx._internal.worker.profiling import request_path, trace_path, workers_path
from phalanx.cli._runs import CLIError, open_run

__all__ = ["add_parser", "profile"]

Out = Callable[[str], None]
TRACE_GRACE_S = 30.0  # after the flame graph, how long to wait for the trace's steps


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "profile", help="a flame graph (py-spy) and a torch.profiler trace of one running rank"
    )
    parser.add_argument("run")
    parser.add_argument("--rank", type=int, default=0, help="the rank to profile (default 0)")
    parser.add_argument("--seconds", type=int, default=10, help="py-spy's capture, whole seconds")
    parser.add_argument("--steps", type=int, default=10, help="steps in the torch.profiler trace")
    parser.add_argument(
        "--rate", type=int, default=100, help="py-spy's samples per second (default 100)"
    )


def profile(args: argparse.Namespace, out: Out) -> None:
    if args.seconds <= 0 or args.steps <= 0 or args.rate <= 0:
        raise CLIError(
            f"phalanx profile --seconds {args.seconds} --steps {args.steps} --rate {args.rate}: "
            "each must be > 0.\nHINT: phalanx profile <run> --rank 0 --seconds 10 --steps 10"
        )
    run = open_run(args.run)
    run_dir = run.storage.local_path
    if run_dir is None:
        raise CLIError(
            f"run {run.name} is on remote storage ({run.uri}): phalanx profile reads and writes "
            "its files on the driver's host.\nHINT: run phalanx profile on the driver's host, "
            "with the run's storage_path there."
        )
    worker = _worker(run_dir, args.rank, run.name)
    spy = shutil.which("py-spy")
    if spy is None:
        raise CLIError("phalanx profile needs py-spy.\nHINT: pip install py-spy")
    request_id = time.strftime("%Y%m%d-%H%M%S")
    request = request_path(run_dir, args.rank)
    with open(request + ".tmp", "w") as f:
        json.dump({"id": request_id, "steps": args.steps}, f)
    os.replace(request + ".tmp", request)
    flame = os.path.join(os.path.dirname(request), f"rank-{args.rank}-{request_id}.svg")
    out(
        f"profiling rank {args.rank} (pid {worker['pid']} on {worker['host']}) for "
        f"{args.seconds} s, and its next {args.steps} steps with torch.profiler ..."
    )
    command = [spy, "record", "--pid", str(worker["pid"]), "--duration", str(args.seconds)]
    command += ["--rate", str(args.rate), "--nonblocking", "--format", "flamegraph"]
    command += ["--output", flame]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not os.path.exists(flame):
        _withdraw(request)
        raise CLIError(
            f"py-spy could not profile pid {worker['pid']}: {(done.stderr or done.stdout).strip()}"
            "\nHINT: py-spy needs the right to trace the process (run as the same user, or "
            "with sudo; in a container, --cap-add SYS_PTRACE)."
        )
    out(f"wrote {flame}")
    trace = trace_path(run_dir, args.rank, request_id)
    deadline = time.monotonic() + TRACE_GRACE_S
    while not os.path.exists(trace) and time.monotonic() < deadline:
        if not _alive(int(worker["pid"])):
            break
        time.sleep(0.2)
    if os.path.exists(trace):
        out(f"wrote {trace}")
        return
    taken = not os.path.exists(request)
    _withdraw(request)
    out(
        "no torch.profiler trace: "
        + (
            f"rank {args.rank} did not finish {args.steps} steps in time"
            if taken
            else f"rank {args.rank} did not report() since the request (or torch is not used)"
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

"""Helpers every benchmark here shares: statistics, machine facts, ports, process clean-up.

The scripts run as ``python bench/<name>.py`` (also in the subprocesses they start), so this
module is importable as ``common``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import signal
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def machine() -> Record:
    cpu = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
           if ln.startswith("model name")]  # fmt: skip
    mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal"))  # fmt: skip
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem / 2**20, 1),
        "cpu_model": cpu[0] if cpu else platform.processor(),
        "platform": platform.platform(),
        "load_start": os.getloadavg()[0],
    }


def versions() -> Record:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "ray": version("ray"),
        "phalanx": version("phalanx"),
    }


MARKER_ENV = "PHALANX_BENCH_RUN"
"""Set to a fresh marker (``uuid.uuid4().hex``) in a run's environment, it marks every process the
run starts, however it detaches (Ray's daemons start sessions of their own)."""


def has_marker(pid: int, marker: str) -> bool:
    """Whether process ``pid`` carries ``MARKER_ENV=marker`` (False once it is gone)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{MARKER_ENV}={marker}".encode() in env


def marked_pids(marker: str) -> list[int]:
    """Live processes carrying the run's marker: the ones a run started."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and has_marker(int(e), marker)]


def session_pids(sid: int) -> list[int]:
    """Live processes whose session id is ``sid`` (the session of a run this script started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def reap(find: Callable[[], list[int]], grace_s: float = 0.0) -> list[str]:
    """Wait up to ``grace_s`` for the processes ``find()`` lists to exit; kill (SIGKILL, by pid)
    those still there and return them as ``"pid name"``: what a finished run left behind."""
    deadline = time.monotonic() + grace_s
    while (pids := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = []
    for pid in pids:
        try:
            name = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .split(b"\0")[0]
                .decode(errors="replace")[-60:]
            )
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
        left.append(f"{pid} {name}")
    return left


def reap_marked(marker: str, grace_s: float = 5.0) -> list[str]:
    """``reap`` the processes carrying ``marker`` (see MARKER_ENV)."""
    return reap(lambda: marked_pids(marker), grace_s)


def reap_session(sid: int, grace_s: float = 0.0) -> list[str]:
    """``reap`` the processes of session ``sid`` (a run started with start_new_session=True)."""
    return reap(lambda: session_pids(sid), grace_s)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None

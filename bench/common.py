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


def reap_session(sid: int) -> list[str]:
    """Kill what a finished run left behind in its own session; return their names."""
    left = []
    for pid in session_pids(sid):
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()[-60:]
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
        left.append(f"{pid} {name}")
    return left


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

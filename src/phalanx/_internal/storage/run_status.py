"""Is a run whose record says ``running`` still running?

A driver killed with ``kill -9`` (or a machine that lost power) never writes its end, so the record
keeps ``"running"``. Which it is:

1. On the driver's own host: the driver's pid is alive and started when the record says it did
   (the start time tells a reused pid apart). Dead or different: ``interrupted``. This is exact.
2. From another host: the run lock, when the run has one (``.phalanx_lock``, an OS file lock the
   kernel drops when its owner dies, for local/shared storage; ``.phalanx_lease.json``, a lease with
   a heartbeat, on object stores). A free lock or a stale lease: ``interrupted``.
3. Otherwise it cannot be told from here: ``running`` with ``verified=False``.

A run without a record (written before records existed) gets its status from the snapshot: the
outcome of its last attempt.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from phalanx._internal.storage.run_record import process_start
from phalanx._internal.storage.run_storage import ERROR_TEXT_FILE, RunStorage
from phalanx.errors import StorageError

# --- adapter: the run lock of issue 12 (phalanx._internal.storage.run_lock) ---------------------
# Its file names and staleness are read from that module when it exists; these are its values.
LOCK_FILE = ".phalanx_lock"
LEASE_FILE = ".phalanx_lease.json"
LEASE_STALE_S = 60.0
with contextlib.suppress(ImportError):
    from phalanx._internal.storage import run_lock as _run_lock  # type: ignore[attr-defined]

    LOCK_FILE = _run_lock.LOCK_FILE
    LEASE_FILE = _run_lock.LEASE_FILE
    LEASE_STALE_S = _run_lock.STALE_S
# --- end of adapter ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunStatus:
    """``status``: running / finished / failed / interrupted (or unknown); ``verified`` is False
    when a ``running`` could not be checked from this machine; ``how`` says how it was decided."""

    status: str
    verified: bool = True
    how: str = ""

    def __str__(self) -> str:
        return self.status if self.verified else f"{self.status}?"


def run_status(
    storage: RunStorage, record: dict[str, Any] | None, attempts: list[dict[str, Any]]
) -> RunStatus:
    if record is None:
        return _status_from_snapshot(storage, attempts)
    status = str(record.get("status", "unknown"))
    if status != "running":
        return RunStatus(status, how="recorded")
    return _live_status(storage, record.get("driver") or {})


def _live_status(storage: RunStorage, owner: dict[str, Any]) -> RunStatus:
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        alive = _same_process_alive(owner["pid"], owner.get("pid_start"))
        if alive is not None:
            how = f"driver pid {owner['pid']} on this host is {'alive' if alive else 'gone'}"
            return RunStatus("running" if alive else "interrupted", how=how)
    held = _lock_held(storage)
    if held is None:
        where = owner.get("host", "another host")
        return RunStatus("running", verified=False, how=f"driver on {where}: cannot check")
    return RunStatus("running" if held else "interrupted", how="run lock")


def _same_process_alive(pid: int, started: Any) -> bool | None:
    """True/False when it can be told; None when this system cannot say."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    except OSError:
        return None
    now_started = process_start(pid)
    if isinstance(started, int) and now_started is not None:
        return now_started == started and not _is_zombie(pid)
    return True


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].startswith(b"Z")


def _lock_held(storage: RunStorage) -> bool | None:
    """Whether the run lock is held (None: the run has no lock to look at)."""
    if storage.local:
        return _file_lock_held(storage.path(LOCK_FILE))
    try:
        raw = storage.read(LEASE_FILE)
    except StorageError:
        return None
    if raw is None:
        return None
    try:
        heartbeat = float(json.loads(raw)["heartbeat"])
    except (ValueError, KeyError, TypeError):
        return None
    return time.time() - heartbeat < LEASE_STALE_S


def _file_lock_held(path: str) -> bool | None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released at once by the close below
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


def _status_from_snapshot(storage: RunStorage, attempts: list[dict[str, Any]]) -> RunStatus:
    last = attempts[-1] if attempts else {}
    outcome = last.get("outcome")
    if outcome == "finished":
        return RunStatus("finished", how="snapshot")
    if outcome == "interrupted":
        return RunStatus("interrupted", how="snapshot")
    if outcome is not None:
        failed = storage.read(ERROR_TEXT_FILE) is not None
        return RunStatus("failed" if failed else "interrupted", how="snapshot")
    held = _lock_held(storage)
    if held is not None:
        return RunStatus("running" if held else "interrupted", how="run lock")
    return RunStatus("unknown", verified=False, how="no run.json and no lock")

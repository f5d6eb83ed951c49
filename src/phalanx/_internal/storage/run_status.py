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

import os
import socket
from dataclasses import dataclass
from typing import Any

from phalanx._internal.storage.run_lock import lock_held
from phalanx._internal.storage.run_record import process_start
from phalanx._internal.storage.run_storage import ERROR_TEXT_FILE
from phalanx._internal.storage.store import RunStore


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
    storage: RunStore, record: dict[str, Any] | None, attempts: list[dict[str, Any]]
) -> RunStatus:
    if record is None:
        return _status_from_snapshot(storage, attempts)
    status = str(record.get("status", "unknown"))
    if status != "running":
        return RunStatus(status, how="recorded")
    return _live_status(storage, record.get("driver") or {})


def _live_status(storage: RunStore, owner: dict[str, Any]) -> RunStatus:
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        alive = _same_process_alive(owner["pid"], owner.get("pid_start"))
        if alive is not None:
            how = f"driver pid {owner['pid']} on this host is {'alive' if alive else 'gone'}"
            return RunStatus("running" if alive else "interrupted", how=how)
    held = lock_held(storage)
    if held is None:
        where = owner.get("host", "another host")
        return RunStatus("running", verified=False, how=f"driver on {where}: cannot check")
    return RunStatus("running" if held else "interrupted", how="run lock")


def _same_process_alive(pid: int, started: object) -> bool | None:
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


def _status_from_snapshot(storage: RunStore, attempts: list[dict[str, Any]]) -> RunStatus:
    last = attempts[-1] if attempts else {}
    outcome = last.get("outcome")
    if outcome == "finished":
        return RunStatus("finished", how="snapshot")
    if outcome == "interrupted":
        return RunStatus("interrupted", how="snapshot")
    if outcome is not None:
        failed = storage.read(ERROR_TEXT_FILE) is not None
        return RunStatus("failed" if failed else "interrupted", how="snapshot")
    held = lock_held(storage)
    if held is not None:
        return RunStatus("running" if held else "interrupted", how="run lock")
    return RunStatus("unknown", verified=False, how="no run.json and no lock")

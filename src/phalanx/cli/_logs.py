"""``phalanx logs``: each rank's stdout and stderr, printed or followed while the run goes on.

Logs are files on the driver's machine: ``<run>/logs/rank_<r>.log`` for local storage, a private
cache directory for remote storage (``~/.cache/phalanx/logs/<name>-<hash>/``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from phalanx._internal.storage.run_status import run_status
from phalanx._internal.storage.run_storage import RunStorage
from phalanx.cli._runs import CLIError, RunView

FOLLOW_POLL_S = 0.2  # new lines appear this fast
STATUS_POLL_S = 1.0  # whether the run still runs is asked this often
_RANK_FILE = re.compile(r"^rank_(\d+)\.log$")

Out = Callable[[str], None]


def rank_logs(run: RunView) -> dict[int, str]:
    """``{rank: path}`` of the run's log files."""
    directory = run.log_dir()
    if not os.path.isdir(directory):
        return {}
    found = {}
    for name in os.listdir(directory):
        match = _RANK_FILE.match(name)
        if match:
            found[int(match.group(1))] = os.path.join(directory, name)
    return dict(sorted(found.items()))


def logs(run: RunView, rank: int | None, follow: bool, out: Out) -> None:
    files = rank_logs(run)
    if not files and not (follow and run.status.status == "running"):
        raise CLIError(_no_logs(run))
    if rank is not None and rank not in files and not follow:
        raise CLIError(
            f"Run {run.name!r} has no log for rank {rank} (ranks with logs: "
            f"{', '.join(map(str, files)) or 'none'}).\nHINT: pick one of those ranks, or leave "
            "--rank out for every rank."
        )
    prefix = rank is None  # every rank: each line says whose it is
    positions: dict[int, int] = {}
    _print_new(run, rank, prefix, positions, out)
    if follow:
        _follow(run, rank, positions, out)


def _print_new(
    run: RunView, rank: int | None, prefix: bool, positions: dict[int, int], out: Out
) -> None:
    """Print the complete lines written since the last call (positions: bytes already read)."""
    for r, path in rank_logs(run).items():
        if rank is not None and r != rank:
            continue
        with open(path, "rb") as f:
            f.seek(positions.get(r, 0))
            data = f.read()
        end = data.rfind(b"\n") + 1  # a partial last line waits for its newline
        positions[r] = positions.get(r, 0) + end
        for line in data[:end].decode(errors="replace").splitlines():
            out(f"[rank{r}]: {line}" if prefix else line)


def _follow(run: RunView, rank: int | None, positions: dict[int, int], out: Out) -> None:
    """Print new lines until the run is no longer running (Ctrl-C stops following)."""
    prefix = rank is None
    checked = 0.0
    while True:
        if time.monotonic() - checked >= STATUS_POLL_S:  # one read of run.json (a GET on S3)
            if not _still_running(run.storage):
                break
            checked = time.monotonic()
        time.sleep(FOLLOW_POLL_S)
        _print_new(run, rank, prefix, positions, out)
    _print_new(run, rank, prefix, positions, out)  # what the last moments wrote


def _still_running(storage: RunStorage) -> bool:
    from phalanx._internal.storage.run_record import read_record

    record = read_record(storage)
    return run_status(storage, record, []).status == "running"


def _no_logs(run: RunView) -> str:
    where = run.log_dir()
    if run.storage.local_path is not None:
        return (
            f"Run {run.name!r} has no logs in {where!r}.\nHINT: logs are written by workers "
            "that are processes or Ray actors; a run on the thread engine or with num_workers=0 "
            "prints to the driver's own output only."
        )
    return (
        f"No logs of run {run.name!r} on this machine (looked in {where!r}).\nHINT: with remote "
        "storage each rank's log stays on the machine that ran fit(), in that private cache "
        "directory: run `phalanx logs` there."
    )

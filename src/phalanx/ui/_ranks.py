"""Each rank of a run as the viewer shows it: its reports (``metrics_all_ranks.jsonl``, followed
as it grows), its state in the latest attempt, its log file, and which ranks an attempt's error
names.

A rank's state comes from what the run wrote: ``failed`` when the latest attempt's error names
it, ``running`` while the run runs, else the latest attempt's outcome; the straggler periods
run.json records (at the end of ``fit()``) are listed with the rank.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from typing import TypedDict

from phalanx._internal.storage.history import ATTEMPT_COLUMN
from phalanx._internal.storage.reader import HistoryCursor, RunReader
from phalanx.cli._runs import flatten, is_number

_GROUP = re.compile(r"^\s*\[rank ([\d, ]+)\] (.*)$", re.MULTILINE)
_ROOT = re.compile(r"^Root cause \(earliest failure\), rank (\d+):$", re.MULTILINE)
_RANK_FILE = re.compile(r"^rank_(\d+)\.log$")
SHOWN_METRICS = 6  # of a rank's last report, in the ranks table


class FailureGroup(TypedDict):
    ranks: list[int]
    summary: str


class Failure(TypedDict):
    """An attempt's error, read back: see :func:`failure_of`."""

    ranks: list[int]
    groups: list[FailureGroup]
    root_rank: int | None
    traceback: str


class RankState(TypedDict, total=False):
    """A rank's reports in its latest attempt (``iteration`` and ``metrics``: its last one)."""

    rank: int
    attempt: object
    reports: int
    iteration: object
    metrics: dict[str, object]


def failure_of(error: str | None) -> Failure | None:
    """What an attempt's error says (``format_failures``' text): the ranks that failed and how,
    the root cause's rank and its traceback; None for an attempt without an error."""
    if not error:
        return None
    groups: list[FailureGroup] = [
        {"ranks": [int(r) for r in ranks.split(",") if r.strip()], "summary": summary}
        for ranks, summary in _GROUP.findall(error)
    ]
    root = _ROOT.search(error)
    return {
        "ranks": sorted({r for g in groups for r in g["ranks"]}),
        "groups": groups,
        "root_rank": int(root.group(1)) if root else None,
        "traceback": error[root.end() :].strip("\n") if root else error,
    }


class RankReports:
    """The last report of each rank and how many it made in its latest attempt (thread-safe)."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.ranks: dict[int, RankState] = {}
        self._cursor: HistoryCursor | None = None
        self._lock = threading.Lock()

    def refresh(self) -> None:
        with self._lock:
            chunk = self.reader.history_since(self._cursor, all_ranks=True)
            self._cursor = chunk.cursor
            if chunk.restarted:
                self.ranks = {}
            for row in chunk.rows:
                self._add(row)

    def _add(self, row: dict[str, object]) -> None:
        rank = row.get("rank")
        if not isinstance(rank, int):
            return
        attempt = row.get(ATTEMPT_COLUMN)
        state = self.ranks.get(rank)
        if state is None or state.get("attempt") != attempt:
            state = self.ranks[rank] = {"rank": rank, "attempt": attempt, "reports": 0}
        state["reports"] = state.get("reports", 0) + 1
        state["iteration"] = row.get("training_iteration")
        metrics = {
            k: v
            for k, v in flatten(row).items()
            if k not in ("rank", ATTEMPT_COLUMN, "training_iteration") and is_number(v)
        }
        state["metrics"] = dict(list(metrics.items())[:SHOWN_METRICS])

    def snapshot(self) -> dict[int, RankState]:
        with self._lock:
            return {rank: RankState(**state) for rank, state in self.ranks.items()}


def rank_table(
    reports: dict[int, RankState],
    logs: dict[int, LogFile],
    attempts: list[dict[str, object]],
    stragglers: list[dict[str, object]],
    status: str,
    world_size: int | None,
) -> list[dict[str, object]]:
    """One row per rank: reports, state, straggler periods and log."""
    last = attempts[-1] if attempts else {}
    error = last.get("error")
    failure = failure_of(error if isinstance(error, str) else None)
    failed = failure["ranks"] if failure else []
    root_rank = failure["root_rank"] if failure else None
    known = set(reports) | set(logs) | set(range(world_size or 0))
    rows = []
    for rank in sorted(known):
        periods = [p for p in stragglers if p.get("rank") == rank]
        if rank in failed:
            state = "failed"
        elif status == "running":
            state = "running"
        else:
            state = str(last.get("outcome") or status)
        rows.append(
            {
                **reports.get(rank, {"rank": rank, "reports": 0}),
                "state": state,
                "root_cause": rank == root_rank,
                "straggler": [p.get("slowdown") for p in periods],
                "log": logs.get(rank),
            }
        )
    return rows


class LogFile(TypedDict):
    size: int


def rank_logs(reader: RunReader, allowed: Callable[[str], bool]) -> dict[int, LogFile]:
    """``{rank: {"size": bytes}}`` of the run's log files that are regular files inside
    ``allowed`` (a predicate on a path: a symlink out of the run is left out)."""
    directory = reader.log_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    found: dict[int, LogFile] = {}

    for name in names:
        match = _RANK_FILE.match(name)
        path = os.path.join(directory, name)
        if match and allowed(path) and os.path.isfile(path):
            found[int(match.group(1))] = {"size": os.path.getsize(path)}
    return dict(sorted(found.items()))

"""The run's metrics history: one JSON line per round (rank 0) and per report (all ranks).

Every row carries ``_phalanx_attempt`` (1-based, counted over the run's whole life, as in the
snapshot), a name no user writes, so a metric named ``attempt`` stays the user's (Ray reserves no
such name). Runs written before the rename call it ``attempt``: :func:`read_history` reads that
column as phalanx's.

A retry restarts from the latest checkpoint, so its rows repeat the ``training_iteration`` of rows
the abandoned attempt wrote after that checkpoint: :func:`final_trajectory` keeps the retry's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import TypeGuard

from phalanx._internal.storage.run_storage import ALL_RANKS_HISTORY_FILE, HISTORY_FILE
from phalanx._internal.storage.store import RunLog, RunStore

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
ATTEMPT_COLUMN = "_phalanx_attempt"
LEGACY_ATTEMPT_COLUMN = "attempt"  # phalanx's name for it in runs written before
# Columns phalanx adds to the rows of metrics.jsonl (stripped again for Result.metrics).
AUTO_FILLED = ("training_iteration", "timestamp", "checkpoint_dir_name", ATTEMPT_COLUMN)

Row = dict[str, object]  # one line of a history file: the user's metrics and AUTO_FILLED


def _default(value: object) -> object:
    for attr in ("item", "tolist"):  # numpy scalars/arrays, 0-d tensors
        method = getattr(value, attr, None)
        if callable(method):
            try:
                return method()
            except (TypeError, ValueError):
                pass
    return repr(value)


def encode_json(value: object) -> str:
    return json.dumps(value, default=_default, allow_nan=True)


def decode_lines(data: bytes | None) -> list[Row]:
    if not data:
        return []
    rows: list[Row] = []
    for line in data.decode().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut by a crash mid-write: keep the rest
                continue
    return rows


class MetricsHistory:
    """Appends rows to the history files; flushed at commits, at the end and every second.

    Each file is a ``RunLog`` of the store (appended in place locally; one part object per
    flush on object stores, see ``history_parts``). A resumed run continues the existing files.
    """

    def __init__(self, storage: RunStore) -> None:
        self.storage = storage
        self.attempt = 1
        self._pending: dict[str, list[str]] = {HISTORY_FILE: [], ALL_RANKS_HISTORY_FILE: []}
        self._logs: dict[str, RunLog] = {name: storage.open_log(name) for name in self._pending}
        self._last_flush = time.monotonic()
        self._cut: dict[str, bool] = {}
        for name, log in self._logs.items():
            cut = log.repair()
            self._cut[name] = bool(cut)
            if cut:
                logger.warning("Repaired %s: dropped a partial last row (%d bytes).", name, cut)

    def rows_at_start(self) -> int:
        """Rows metrics.jsonl had when the run (re)started, a row cut by a crash included."""
        return int(self._cut[HISTORY_FILE]) + self._logs[HISTORY_FILE].count_lines()

    def last_metrics(self) -> dict[str, object] | None:
        """The user's metrics of the last row of the final trajectory (None for a new run)."""
        rows = final_trajectory(upgraded(decode_lines(self._logs[HISTORY_FILE].read())))
        return user_metrics(rows[-1]) if rows else None

    def add_round(
        self, round_index: int, metrics: Mapping[str, object], checkpoint_dir_name: str | None
    ) -> None:
        row: Row = dict(metrics)
        row.setdefault("training_iteration", round_index + 1)
        row.setdefault("timestamp", time.time())
        row["checkpoint_dir_name"] = checkpoint_dir_name
        row[ATTEMPT_COLUMN] = self.attempt
        self._pending[HISTORY_FILE].append(encode_json(row))

    def add_rank_report(self, rank: int, round_index: int, metrics: Mapping[str, object]) -> None:
        row: Row = {
            "rank": rank,
            ATTEMPT_COLUMN: self.attempt,
            "training_iteration": round_index + 1,
            **metrics,
        }
        self._pending[ALL_RANKS_HISTORY_FILE].append(encode_json(row))

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        for name, lines in self._pending.items():
            if not lines:
                continue
            text = "\n".join(lines) + "\n"
            lines.clear()
            self._logs[name].append(text.encode())

    def compact(self, name: str | None = None) -> None:
        """Leave the files whole (object stores fold their parts in; at the end of fit())."""
        for each in [name] if name else list(self._logs):
            self._logs[each].compact()


def read_history(storage: RunStore, all_ranks: bool = False) -> list[Row]:
    """The rows of a history file, phalanx's attempt column under its current name."""
    name = ALL_RANKS_HISTORY_FILE if all_ranks else HISTORY_FILE
    return upgraded(decode_lines(storage.read_log(name)))


def upgraded(rows: list[Row]) -> list[Row]:
    """Rows of a run written before the rename have ``attempt`` with phalanx's meaning (users
    could not report one then): renamed, in its position. A row that has the new
    column keeps ``attempt``: it is the user's metric."""
    for i, row in enumerate(rows):
        if ATTEMPT_COLUMN not in row and LEGACY_ATTEMPT_COLUMN in row:
            rows[i] = {
                (ATTEMPT_COLUMN if k == LEGACY_ATTEMPT_COLUMN else k): v for k, v in row.items()
            }
    return rows


def final_trajectory(rows: list[Row]) -> list[Row]:
    """Rows in order, each ``training_iteration`` once: when an attempt's first row repeats the
    iteration of earlier attempts' rows (it restarted from a checkpoint), those rows and every
    later one of the earlier attempts are superseded. Rows within one attempt are never dropped.
    """
    kept: list[Row] = []
    attempt: object = None
    for row in rows:
        if row.get(ATTEMPT_COLUMN) != attempt:
            attempt = row.get(ATTEMPT_COLUMN)
            start = row.get("training_iteration")
            if _is_number(start):
                kept = [r for r in kept if not _superseded(r, float(start))]
        kept.append(row)
    return kept


def user_metrics(row: Row) -> dict[str, object]:
    return {k: v for k, v in row.items() if k not in AUTO_FILLED}


def _superseded(row: Row, start: float) -> bool:
    iteration = row.get("training_iteration")
    return _is_number(iteration) and float(iteration) >= start


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)

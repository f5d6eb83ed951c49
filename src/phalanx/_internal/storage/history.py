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
import os
import time
from typing import Any

from phalanx._internal.storage import history_parts as parts
from phalanx._internal.storage.filesystem import storage_errors
from phalanx._internal.storage.run_storage import ALL_RANKS_HISTORY_FILE, HISTORY_FILE, RunStorage

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
ATTEMPT_COLUMN = "_phalanx_attempt"
LEGACY_ATTEMPT_COLUMN = "attempt"  # phalanx's name for it in runs written before
# Columns phalanx adds to the rows of metrics.jsonl (stripped again for Result.metrics).
AUTO_FILLED = ("training_iteration", "timestamp", "checkpoint_dir_name", ATTEMPT_COLUMN)


def _default(value: Any) -> Any:
    for attr in ("item", "tolist"):  # numpy scalars/arrays, 0-d tensors
        method = getattr(value, attr, None)
        if callable(method):
            try:
                return method()
            except (TypeError, ValueError):
                pass
    return repr(value)


def encode_json(value: Any) -> str:
    return json.dumps(value, default=_default, allow_nan=True)


def decode_lines(data: bytes | None) -> list[dict[str, Any]]:
    if not data:
        return []
    rows = []
    for line in data.decode().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut by a crash mid-write: keep the rest
                continue
    return rows


class MetricsHistory:
    """Appends rows to the history files; flushed at commits, at the end and every second.

    On a local filesystem rows are appended; elsewhere each flush writes one part object
    (object stores cannot append; see ``history_parts``). A resumed run continues the existing
    files.
    """

    def __init__(self, storage: RunStorage) -> None:
        self.storage = storage
        self.attempt = 1
        self._pending: dict[str, list[str]] = {HISTORY_FILE: [], ALL_RANKS_HISTORY_FILE: []}
        self._remote_text: dict[str, str] = {}
        self._last_flush = time.monotonic()
        self._cut: dict[str, bool] = {}
        self._seq: dict[str, int] = {}  # object stores: the last part written
        self._base: dict[str, int] = {}  # object stores: bytes in the base file
        self._written: dict[str, list[bytes]] = {}  # object stores: the base, then each part
        self._parts: dict[str, tuple[int, int]] = {}  # object stores: (parts, bytes) after it
        for name in self._pending:
            self._repair(name)

    def _repair(self, name: str) -> None:
        """A file cut mid-line by a crash: drop the partial last row, so that appended rows start
        on a line of their own (otherwise the first of them is lost with it)."""
        if self.storage.local:
            path = self.storage.path(name)
            if not os.path.isfile(path):  # none yet (or not a regular file: leave it alone)
                return
            with open(path, "rb+") as f:
                size = f.seek(0, os.SEEK_END)
                keep = _end_of_last_line(f, size)
                if keep < size:
                    f.truncate(keep)
            cut = size - keep
        else:
            data, seq, base = parts.read_whole(self.storage, name)
            keep = data.rfind(b"\n") + 1
            cut = len(data) - keep
            if cut or base != len(data) or parts.read_marker(self.storage, name) is None:
                parts.compact(self.storage, name, data[:keep], seq)
            self._seq[name], self._base[name], self._parts[name] = seq, keep, (0, 0)
            self._written[name] = [data[:keep]]
            self._remote_text[name] = data[:keep].decode()
        self._cut[name] = bool(cut)
        if cut:
            logger.warning("Repaired %s: dropped a partial last row (%d bytes).", name, cut)

    def rows_at_start(self) -> int:
        """Rows metrics.jsonl had when the run (re)started, a row cut by a crash included.
        Streamed, never read whole (the file may not be a regular one)."""
        rows = int(self._cut.get(HISTORY_FILE, False))
        if not self.storage.local:
            return rows + sum(1 for line in self._remote_text[HISTORY_FILE].splitlines() if line)
        path = self.storage.path(HISTORY_FILE)
        if not os.path.isfile(path):
            return rows
        with open(path, "rb") as f:
            return rows + sum(1 for line in f if line.strip())

    def last_metrics(self) -> dict[str, Any] | None:
        """The user's metrics of the last row of the final trajectory (None for a new run)."""
        if self.storage.local:
            if not os.path.isfile(self.storage.path(HISTORY_FILE)):
                return None
            rows = final_trajectory(read_history(self.storage))
        else:  # read once already, by _repair
            rows = final_trajectory(
                upgraded(decode_lines(self._remote_text[HISTORY_FILE].encode()))
            )
        return user_metrics(rows[-1]) if rows else None

    def add_round(
        self, round_index: int, metrics: dict[str, Any], checkpoint_dir_name: str | None
    ) -> None:
        row = dict(metrics)
        row.setdefault("training_iteration", round_index + 1)
        row.setdefault("timestamp", time.time())
        row["checkpoint_dir_name"] = checkpoint_dir_name
        row[ATTEMPT_COLUMN] = self.attempt
        self._pending[HISTORY_FILE].append(encode_json(row))

    def add_rank_report(self, rank: int, round_index: int, metrics: dict[str, Any]) -> None:
        row = {
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
            if self.storage.local:
                _append(self.storage.path(name), text)
            else:
                self._write_part(name, text.encode())

    def _write_part(self, name: str, data: bytes) -> None:
        """One object per flush: O(rows flushed), not O(rows so far). Compacted once the parts
        hold as much as the base (O(1) per row amortised) or are many."""
        self._seq[name] += 1
        parts.write_part(self.storage, name, self._seq[name], data)
        self._written[name].append(data)
        count, size = self._parts[name]
        self._parts[name] = count, size = count + 1, size + len(data)
        if size >= max(self._base[name], 1 << 16) or count >= parts.MAX_PARTS:
            self.compact(name)

    def compact(self, name: str | None = None) -> None:
        """Object stores: fold the parts into the base file (at the end of fit(): one whole
        file, as readers without parts expect)."""
        if self.storage.local:
            return
        for each in [name] if name else list(self._pending):
            if self._parts[each][0]:  # this driver alone writes (the run lock): no need to read
                data = b"".join(self._written[each])
                parts.compact(self.storage, each, data, self._seq[each])
                self._written[each] = [data]
                self._base[each], self._parts[each] = len(data), (0, 0)


def _append(path: str, text: str) -> None:
    """Append whole lines or nothing: on a full disk the file is cut back to where it was."""
    with storage_errors("append to", path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            data = memoryview(text.encode())
            try:
                while data:
                    data = data[os.write(fd, data) :]
            except BaseException:
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)


def read_history(storage: RunStorage, all_ranks: bool = False) -> list[dict[str, Any]]:
    """The rows of a history file, phalanx's attempt column under its current name."""
    name = ALL_RANKS_HISTORY_FILE if all_ranks else HISTORY_FILE
    if storage.local:
        return upgraded(decode_lines(storage.read(name)))
    return upgraded(decode_lines(parts.read_whole(storage, name)[0]))


def upgraded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of a run written before the rename have ``attempt`` with phalanx's meaning (users
    could not report one then): renamed, in its position. A row that has the new
    column keeps ``attempt``: it is the user's metric."""
    for i, row in enumerate(rows):
        if ATTEMPT_COLUMN not in row and LEGACY_ATTEMPT_COLUMN in row:
            rows[i] = {
                (ATTEMPT_COLUMN if k == LEGACY_ATTEMPT_COLUMN else k): v for k, v in row.items()
            }
    return rows


def final_trajectory(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in order, each ``training_iteration`` once: when an attempt's first row repeats the
    iteration of earlier attempts' rows (it restarted from a checkpoint), those rows and every
    later one of the earlier attempts are superseded. Rows within one attempt are never dropped.
    """
    kept: list[dict[str, Any]] = []
    attempt: Any = None
    for row in rows:
        if row.get(ATTEMPT_COLUMN) != attempt:
            attempt = row.get(ATTEMPT_COLUMN)
            start: Any = row.get("training_iteration")
            if _is_number(start):
                kept = [r for r in kept if not _superseded(r, float(start))]
        kept.append(row)
    return kept


def user_metrics(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in AUTO_FILLED}


def _superseded(row: dict[str, Any], start: float) -> bool:
    iteration: Any = row.get("training_iteration")
    return _is_number(iteration) and float(iteration) >= start


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _end_of_last_line(f: Any, size: int, block: int = 65536) -> int:
    """The offset just after the file's last newline (0 if it has none)."""
    end = size
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        chunk = f.read(end - start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0

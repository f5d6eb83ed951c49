"""The run's metrics history: one JSON line per round (rank 0) and per report (all ranks)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from phalanx._internal.storage.filesystem import storage_errors
from phalanx._internal.storage.run_storage import ALL_RANKS_HISTORY_FILE, HISTORY_FILE, RunStorage

FLUSH_INTERVAL_S = 1.0


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

    On a local filesystem rows are appended; elsewhere the whole file is rewritten on flush
    (object stores cannot append). A resumed run continues the existing files.
    """

    def __init__(self, storage: RunStorage) -> None:
        self.storage = storage
        self._pending: dict[str, list[str]] = {HISTORY_FILE: [], ALL_RANKS_HISTORY_FILE: []}
        self._remote_text: dict[str, str] = {}
        self._last_flush = time.monotonic()

    def add_round(
        self, round_index: int, metrics: dict[str, Any], checkpoint_dir_name: str | None
    ) -> None:
        row = dict(metrics)
        row.setdefault("training_iteration", round_index + 1)
        row.setdefault("timestamp", time.time())
        row["checkpoint_dir_name"] = checkpoint_dir_name
        self._pending[HISTORY_FILE].append(encode_json(row))

    def add_rank_report(self, rank: int, round_index: int, metrics: dict[str, Any]) -> None:
        row = {"rank": rank, "training_iteration": round_index + 1, **metrics}
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
                previous = self._remote_text.get(name)
                if previous is None:
                    previous = (self.storage.read(name) or b"").decode()
                self._remote_text[name] = previous + text
                self.storage.write_atomic(name, self._remote_text[name].encode())


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
    return decode_lines(storage.read(ALL_RANKS_HISTORY_FILE if all_ranks else HISTORY_FILE))

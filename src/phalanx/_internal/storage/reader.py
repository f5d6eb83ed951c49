"""Reading a run directory: the one way ``Result``, ``Result.from_path`` and the CLI read a run.

A reader never writes: it takes no claim, repairs nothing and reads the snapshot with its
journal applied, the history as its owner left it (parts included on object stores), the
record, the error and the status (which asks the store whether the run's owner is alive).

A reader that follows a live run (``phalanx ui``) reads the history incrementally:
:meth:`RunReader.history_since` returns the rows appended after a :class:`HistoryCursor`, and
:meth:`RunReader.last_history_row` the last row alone, both read from where they are in a local
file (object stores hold the history as parts: read whole, decoded from the cursor on).

Example::

    reader = RunReader.open("~/phalanx_results/my_run")
    print(reader.history()[-1], reader.status())
    chunk = reader.history_since()  # every row so far
    later = reader.history_since(chunk.cursor)  # only the rows written since
"""

from __future__ import annotations

import logging
import os
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phalanx._foundation.fs.access import storage_errors
from phalanx._foundation.goodput_parts import Goodput
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.history import (
    decode_lines,
    final_trajectory,
    read_history,
    upgraded,
    user_metrics,
)
from phalanx._internal.storage.run_record import read_record
from phalanx._internal.storage.run_status import RunStatus, run_status
from phalanx._internal.storage.run_storage import (
    ALL_RANKS_HISTORY_FILE,
    ERROR_PICKLE_FILE,
    ERROR_TEXT_FILE,
    HISTORY_FILE,
    SNAPSHOT_FILE,
    RunStorage,
)
from phalanx._internal.storage.store import RunStore
from phalanx.config import CheckpointConfig
from phalanx.errors import StorageError, TrainingFailedError

if TYPE_CHECKING:
    from phalanx.result import Result

logger = logging.getLogger(__name__)

_HEAD_BYTES = 64  # a file's first bytes, which tell a replaced history file from a grown one
_TAIL_BLOCK = 65536


@dataclass(frozen=True)
class HistoryCursor:
    """Where a reader following a history file is: the bytes of whole lines read so far and the
    file's first bytes (a file that was replaced, e.g. a run started afresh, is read again)."""

    offset: int = 0
    head: bytes = b""


@dataclass(frozen=True)
class HistoryChunk:
    """The rows after a cursor; ``restarted``: the file was replaced or cut, so ``rows`` are the
    whole file again (a follower drops what it had)."""

    rows: list[dict[str, Any]]
    cursor: HistoryCursor
    restarted: bool = False


class RunReader:
    """Reads one run directory; every method reads storage afresh."""

    def __init__(self, storage: RunStore, shown_as: str | None = None) -> None:
        self.storage = storage
        self.shown_as = shown_as or storage.run_uri  # the path as the caller wrote it

    @property
    def filesystem(self) -> Any:
        return self.storage.filesystem

    @property
    def local_path(self) -> str | None:
        return self.storage.local_path

    @classmethod
    def open(cls, path: str | os.PathLike[str], filesystem: object = None) -> RunReader:
        """The run at ``path`` (``<storage_path>/<name>``, a local path or a URI)."""
        path = os.fspath(path).rstrip("/")
        parent, name = path.rsplit("/", 1) if "/" in path else (".", path)
        return cls(RunStorage.create(parent, name, filesystem), path)

    def record(self) -> dict[str, Any] | None:
        """``run.json`` (None for a run written before records existed)."""
        return read_record(self.storage)

    def checkpoints(self, config: CheckpointConfig | None = None) -> CheckpointManager | None:
        """The committed checkpoints, ranked by ``config``; None without a snapshot."""
        manager = CheckpointManager(self.storage, config or CheckpointConfig())
        return manager if manager.load() else None

    def history(self) -> list[dict[str, Any]]:
        """The trajectory: rank 0's rows, each ``training_iteration`` once."""
        return final_trajectory(read_history(self.storage))

    def all_ranks_history(self) -> list[dict[str, Any]]:
        return read_history(self.storage, all_ranks=True)

    def history_since(
        self, cursor: HistoryCursor | None = None, all_ranks: bool = False
    ) -> HistoryChunk:
        """The whole rows appended to the history after ``cursor`` (all of them without one),
        as written (no trajectory applied); a line still being written waits for the next call.
        A local file is read from the cursor's offset on; other stores' logs are read whole."""
        cursor = cursor or HistoryCursor()
        name = ALL_RANKS_HISTORY_FILE if all_ranks else HISTORY_FILE
        path = self.storage.local_path and self.storage.path(name)
        if path:
            head, start, data = _read_local_from(path, cursor)
        else:
            whole = self.storage.read_log(name)
            head, start = whole[:_HEAD_BYTES], _start(cursor, len(whole), whole[:_HEAD_BYTES])
            data = whole[start:]
        end = start + data.rfind(b"\n") + 1
        rows = upgraded(decode_lines(data[: end - start]))
        after = HistoryCursor(end, head[: min(end, _HEAD_BYTES)])
        return HistoryChunk(rows, after, restarted=cursor.offset > 0 and start == 0)

    def last_history_row(self) -> dict[str, Any] | None:
        """The last whole row of ``metrics.jsonl`` (the trajectory's last, ``Result.metrics``):
        a local file is read from its end, not whole."""
        path = self.storage.local_path and self.storage.path(HISTORY_FILE)
        data = _local_tail(path) if path else self.storage.read_log(HISTORY_FILE)
        complete = data[: data.rfind(b"\n") + 1]
        for line in reversed(complete.splitlines()):
            rows = upgraded(decode_lines(line))
            if rows:
                return rows[0]
        return None

    def error_text(self) -> str | None:
        text = self.storage.read(ERROR_TEXT_FILE)
        return text.decode(errors="replace") if text is not None else None

    def error(self, load_pickle: bool = False) -> BaseException | None:
        """The run's error from ``error.txt``; from ``error.pkl`` only when the caller asks."""
        if load_pickle:
            raw = self.storage.read(ERROR_PICKLE_FILE)
            if raw is not None:
                try:
                    return pickle.loads(raw)  # type: ignore[no-any-return]
                except Exception as exc:
                    raise StorageError(
                        f"{self.storage.path(ERROR_PICKLE_FILE)!r} could not be unpickled: "
                        f"{type(exc).__name__}: {exc}.\nHINT: leave load_error_pickle unset to "
                        "get the error's message from error.txt."
                    ) from exc
        text = self.error_text()
        return TrainingFailedError(text) if text is not None else None

    def status(self, record: dict[str, Any] | None, attempts: list[dict[str, Any]]) -> RunStatus:
        return run_status(self.storage, record, attempts)

    def log_dir(self) -> str:
        """Where the ranks' logs of this run are (nothing is created)."""
        return self.storage.local_log_dir(create=False)

    def result(self, result_cls: type[Result], load_error_pickle: bool = False) -> Result:
        """The run as a :class:`~phalanx.Result` (``Result.from_path``)."""
        manager = self.checkpoints()
        if manager is None:
            raise StorageError(
                f"{self.shown_as!r} is not a phalanx run directory (no {SNAPSHOT_FILE}).\n"
                "HINT: pass result.path, i.e. <storage_path>/<name>."
            )
        history = self.history()
        error = self.error(load_error_pickle)
        result = result_cls(
            metrics=user_metrics(history[-1]) if history else None,
            checkpoint=manager.latest_checkpoint,
            error=error,
            path=self.storage.run_uri,
            best_checkpoints=manager.best_checkpoints(),
            attempts=max(manager.attempts, 1),
            attempt_errors=[entry.get("error") for entry in manager.attempt_history],
            stragglers=_recorded_stragglers(self.storage),
            goodput=_recorded_goodput(self.storage),
            _storage=self,
        )
        if isinstance(error, TrainingFailedError) and error.result is None:
            error.result = result
        return result


def _recorded_stragglers(storage: RunStore) -> list[dict[str, Any]]:
    """run.json's straggler periods ([] for a run recorded before they were, or unreadable)."""
    try:
        record = read_record(storage) or {}
    except StorageError as exc:  # a damaged run.json: the checkpoints and metrics still load
        logger.warning("Stragglers not loaded: %s", exc)
        return []
    periods = record.get("stragglers")
    return [p for p in periods if isinstance(p, dict)] if isinstance(periods, list) else []


def _recorded_goodput(storage: RunStore) -> Goodput | None:
    """run.json's goodput breakdown (None for a run recorded without one, or unreadable)."""
    try:
        data = (read_record(storage) or {}).get("goodput")
        return Goodput.from_dict(data) if isinstance(data, dict) else None
    except (StorageError, KeyError, TypeError, ValueError, AttributeError) as exc:
        logger.warning("Goodput not loaded: %s", exc)
        return None


def _start(cursor: HistoryCursor, size: int, head: bytes) -> int:
    """Where to read on from: the cursor's offset, or 0 when the file no longer continues the
    one the cursor was taken on (shorter, or other first bytes)."""
    if size < cursor.offset or head[: len(cursor.head)] != cursor.head:
        return 0
    return cursor.offset


def _read_local_from(path: str, cursor: HistoryCursor) -> tuple[bytes, int, bytes]:
    """(the file's first bytes, where the read started, the bytes from there to the end)."""
    if not os.path.isfile(path):  # none yet, or not a regular file (a device would never end)
        return b"", 0, b""
    with storage_errors("read", path), open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(_HEAD_BYTES)
        start = _start(cursor, size, head)
        f.seek(start)
        return head, start, f.read()


def _local_tail(path: str) -> bytes:
    """The end of a local file: enough blocks to hold its last whole line."""
    if not os.path.isfile(path):
        return b""
    with storage_errors("read", path), open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        start = end
        while start > 0:
            start = max(0, start - _TAIL_BLOCK)
            f.seek(start)
            data = f.read(end - start)
            if data.count(b"\n") >= 2 or start == 0:  # a whole last line, and the one before
                return data
        return b""

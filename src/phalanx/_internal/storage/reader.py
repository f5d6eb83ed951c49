"""Reading a run directory: the one way ``Result``, ``Result.from_path`` and the CLI read a run.

A reader never writes: it takes no claim, repairs nothing and reads the snapshot with its
journal applied, the history as its owner left it (parts included on object stores), the
record, the error and the status (which asks the store whether the run's owner is alive).

Example::

    reader = RunReader.open("~/phalanx_results/my_run")
    print(reader.history()[-1], reader.status())
"""

from __future__ import annotations

import logging
import os
import pickle
from typing import TYPE_CHECKING, Any

from phalanx._internal.goodput import Goodput
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.history import final_trajectory, read_history, user_metrics
from phalanx._internal.storage.run_record import read_record
from phalanx._internal.storage.run_status import RunStatus, run_status
from phalanx._internal.storage.run_storage import (
    ERROR_PICKLE_FILE,
    ERROR_TEXT_FILE,
    SNAPSHOT_FILE,
    RunStorage,
)
from phalanx._internal.storage.store import RunStore
from phalanx.config import CheckpointConfig
from phalanx.errors import StorageError, TrainingFailedError

if TYPE_CHECKING:
    from phalanx.result import Result

logger = logging.getLogger(__name__)


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
    def open(cls, path: str | os.PathLike[str], filesystem: Any = None) -> RunReader:
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

"""Result: what a run produced, in memory or reloaded from storage."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from phalanx._foundation.goodput_parts import Goodput
from phalanx._foundation.optional import require
from phalanx._internal.storage.reader import RunReader
from phalanx.checkpoint import Checkpoint

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow.fs

__all__ = ["Result"]


class RunFiles(Protocol):
    """What a Result reads its run directory with: the run reader
    (``_internal/storage/reader.py``, a layer above this module, so named by its surface here)."""

    @property
    def filesystem(self) -> Any: ...

    @property
    def local_path(self) -> str | None: ...

    def history(self) -> list[dict[str, Any]]: ...

    def all_ranks_history(self) -> list[dict[str, Any]]: ...

    def record(self) -> dict[str, Any] | None: ...


@dataclass
class Result:
    """The outcome of ``fit()``.

    ``metrics`` are rank 0's last reported metrics (those of the lowest rank still reporting,
    for rounds after rank 0's function returned), ``checkpoint`` the latest committed one,
    ``best_checkpoints`` the retained ``(checkpoint, metrics)`` pairs (worst first),
    ``metrics_dataframe`` the run's trajectory (rank 0, each ``training_iteration`` once),
    ``all_ranks_metrics_dataframe`` every report of every rank, ``path`` the run directory,
    ``return_value`` what rank 0's training function returned, ``error`` the failure if any,
    ``attempts`` how many attempts the run took and ``attempt_errors`` each attempt's error
    message (None for an attempt that did not fail), oldest first, also after ``from_path``.
    ``stragglers`` lists each period a rank was flagged as a straggler (``rank``, ``host``,
    ``node_id``, ``gpu_ids``, ``slowdown``, ``first_round``/``last_round``,
    ``started``/``ended``, ``attempt``), also after ``from_path`` (read from run.json).
    ``goodput`` says where the wall time went (productive, start-up, checkpoints, data,
    stragglers, failures, other; per attempt and in total), also after ``from_path``.

    Example::

        result = trainer.fit()
        print(result.metrics["loss"], result.checkpoint)
        same = Result.from_path(result.path)
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    error: BaseException | None = None
    path: str | None = None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)
    return_value: Any = None
    attempts: int = 1
    attempt_errors: list[str | None] = field(default_factory=list)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    goodput: Goodput | None = None
    # Reads the run directory; not compared: two Results of one run are equal as before
    _storage: RunFiles | None = field(default=None, repr=False, compare=False)

    @property
    def filesystem(self) -> pyarrow.fs.FileSystem:
        """A ``pyarrow.fs.FileSystem`` that reads ``path`` (as Ray's ``Result.filesystem``)."""
        pafs = require("pyarrow.fs", "Result.filesystem")
        if self._storage is None or self._storage.local_path is not None:
            return pafs.LocalFileSystem()
        return pafs.PyFileSystem(pafs.FSSpecHandler(self._storage.filesystem))

    @property
    def metrics_dataframe(self) -> pd.DataFrame:
        """The run's trajectory: every round's rank-0 metrics, oldest first, each
        ``training_iteration`` once (with ``timestamp``, ``checkpoint_dir_name`` and
        ``_phalanx_attempt``; a metric named ``attempt`` is yours).

        After a retry (or a re-run of an interrupted script) the training function continues from
        the latest checkpoint; the rounds an abandoned attempt reported after that checkpoint are
        superseded by the retry's. ``all_ranks_metrics_dataframe`` keeps them all.
        """
        pd = require("pandas", "Result.metrics_dataframe")
        rows = self._storage.history() if self._storage else []
        return pd.DataFrame(rows)

    @property
    def all_ranks_metrics_dataframe(self) -> pd.DataFrame:
        """Every report of every rank, in arrival order, with ``rank`` and ``_phalanx_attempt``:
        also rounds that never completed (the reports of a rank that failed, superseded rows)."""
        pd = require("pandas", "Result.all_ranks_metrics_dataframe")
        rows = self._storage.all_ranks_history() if self._storage else []
        return pd.DataFrame(rows)

    @property
    def config(self) -> dict[str, Any] | None:
        """What the run remembers of itself (``<run>/run.json``): ``train_loop_config``,
        ``scaling_config``, ``run_config``, ``failure_config``, ``checkpoint_config``,
        ``backend_config``, ``versions``, ``driver`` (host, pid), ``started``/``ended`` (Unix
        times) and ``status``. Values JSON cannot hold appear as ``{"__repr__": "..."}``.
        None for a run written before phalanx kept this file.

        Ray V1's ``Result.config`` held the trial's config, ``{"train_loop_config": ...}``;
        ``result.config["train_loop_config"]`` reads the same here.
        """
        return self._storage.record() if self._storage else None

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The retained checkpoint with the best ``metric`` (``mode`` is ``"max"`` or ``"min"``;
        ``"a/b"`` reads ``metrics["a"]["b"]``). Raises RuntimeError, as Ray does, when the run
        kept no checkpoint or none of them has ``metric``."""
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if not self.best_checkpoints:
            raise RuntimeError(
                "This run has no checkpoint to choose from.\nHINT: pass checkpoint=... to "
                "report() to save checkpoints."
            )
        scored = [(c, v) for c, m in self.best_checkpoints if (v := _lookup(m, metric)) is not None]
        if not scored:
            known = sorted({k for _, m in self.best_checkpoints for k in m})
            raise RuntimeError(
                # Ray's wording first: scripts and Ray's own tests match on it
                f"Invalid metric name {metric}! No checkpoint of this run has the metric "
                f"{metric!r}.\nHINT: pick one of the metrics reported with the checkpoints: "
                f"{known}."
            )
        pick = max if mode == "max" else min
        return pick(scored, key=lambda pair: pair[1])[0]

    @classmethod
    def from_path(
        cls,
        path: str | os.PathLike[str],
        storage_filesystem: Any = None,
        *,
        load_error_pickle: bool = False,
    ) -> Result:
        """Reload the Result of a run from its directory (local path or URI).

        ``error`` (when the run failed) is a :class:`~phalanx.TrainingFailedError` with the
        saved message (``error.txt``). The original exception object is kept in ``error.pkl``, a
        pickle: loading it runs code from the run directory, so it is loaded only with
        ``load_error_pickle=True``, for run directories you trust.
        """
        reader = RunReader.open(path, storage_filesystem)
        return reader.result(cls, load_error_pickle=load_error_pickle)


def _lookup(metrics: dict[str, Any], name: str) -> Any:
    """``metrics[name]``, or a nested value for ``"a/b"``; None when absent."""
    if name in metrics:
        return metrics[name]
    value: Any = metrics
    for part in name.split("/"):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def attempt_errors(history: list[dict[str, Any]]) -> list[str | None]:
    """Each attempt's error message from the run's snapshot (text: nothing is unpickled)."""
    return [entry.get("error") for entry in history]

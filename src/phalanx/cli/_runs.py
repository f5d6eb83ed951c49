"""Runs as the CLI sees them: found in a storage path, loaded from their directory (any storage),
with a status that tells a live run from one whose driver died."""

from __future__ import annotations

import contextlib
import difflib
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from phalanx._foundation.fs.access import resolve_filesystem, storage_error, storage_errors
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.history import user_metrics
from phalanx._internal.storage.reader import RunReader
from phalanx._internal.storage.run_record import RUN_FILE
from phalanx._internal.storage.run_status import RunStatus
from phalanx._internal.storage.run_storage import MARKER_FILE, SNAPSHOT_FILE, RunStorage
from phalanx.config import CheckpointConfig
from phalanx.errors import StorageError

logger = logging.getLogger(__name__)

RUN_FILES = (SNAPSHOT_FILE, RUN_FILE, MARKER_FILE)


class CLIError(Exception):
    """A command that cannot do what was asked (unknown run, empty storage, bad argument)."""


@dataclass
class RunView:
    """One run directory, read once: its record, snapshot, history and error."""

    storage: RunStorage
    record: dict[str, Any] | None
    manager: CheckpointManager
    history: list[dict[str, Any]]
    status: RunStatus
    error: str | None
    _all_ranks: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.storage.name

    @property
    def uri(self) -> str:
        return self.storage.run_uri

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return self.manager.attempt_history

    @property
    def started(self) -> float | None:
        """When the latest ``fit()`` of this run started (a resumed run: its last start)."""
        if self.record and is_number(self.record.get("started")):
            return float(self.record["started"])
        return self.attempts[0].get("started") if self.attempts else None

    @property
    def ended(self) -> float | None:
        if self.status.status == "running":
            return None
        if self.record and isinstance(self.record.get("ended"), int | float):
            return float(self.record["ended"])
        ends = [a["ended"] for a in self.attempts if isinstance(a.get("ended"), int | float)]
        if ends:
            return max(ends)
        return self.history[-1].get("timestamp") if self.history else None

    @property
    def duration(self) -> float | None:
        """Seconds from the start of the latest ``fit()`` to its end (to now while running)."""
        if self.started is None:
            return None
        end = self.ended if self.ended is not None else time.time()
        return max(0.0, end - self.started)

    @property
    def last_metrics(self) -> dict[str, Any]:
        return user_metrics(self.history[-1]) if self.history else {}

    @property
    def config(self) -> dict[str, Any]:
        return self.record or {}

    def metric_series(self, metric: str) -> tuple[list[float], list[float]]:
        """``(training_iteration, value)`` of every round that has a number for ``metric``."""
        xs, ys = [], []
        for i, row in enumerate(self.history):
            value = flatten(user_metrics(row)).get(metric)
            if is_number(value):
                x = row.get("training_iteration", i + 1)
                xs.append(float(x) if is_number(x) else float(i + 1))
                ys.append(float(value))
        return xs, ys

    def metric_names(self) -> list[str]:
        """Every metric with a number in some round, in the order they first appear."""
        names: dict[str, None] = {}
        for row in self.history:
            for key, value in flatten(user_metrics(row)).items():
                if is_number(value):
                    names.setdefault(key)
        return list(names)

    def best_checkpoint(self) -> tuple[str, dict[str, Any]] | None:
        """The retained checkpoint ranked best by the run's own CheckpointConfig."""
        ranked = self.manager.best_checkpoints()
        if not ranked:
            return None
        checkpoint, metrics = ranked[-1]
        return checkpoint.path.rstrip("/").rsplit("/", 1)[-1], metrics

    def all_ranks_history(self) -> list[dict[str, Any]]:
        """Every report of every rank (read on first use: the file can be large)."""
        if self._all_ranks is None:
            self._all_ranks = RunReader(self.storage).all_ranks_history()
        return self._all_ranks

    def log_dir(self) -> str:
        return RunReader(self.storage).log_dir()


def flatten(metrics: Mapping[str, object], prefix: str = "") -> dict[str, Any]:
    """Nested metric dicts as ``"outer/inner"`` keys (Ray's flattened columns)."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def is_number(value: object) -> TypeGuard[int | float]:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and not (isinstance(value, float) and math.isnan(value))
    )


# -- finding and opening runs -------------------------------------------------------------------


def split_run_path(path: str) -> tuple[str, str]:
    path = os.fspath(path).rstrip("/")
    if "://" in path and path.count("/") <= 2:  # s3://bucket: no run name in it
        raise CLIError(
            f"{path!r} is a bucket, not a run directory.\n"
            "HINT: pass <storage_path>/<name>; `phalanx ls <storage_path>` lists the runs."
        )
    return path.rsplit("/", 1) if "/" in path else (".", path)  # type: ignore[return-value]


def open_run(path: str, filesystem: object = None) -> RunView:
    """Load the run at ``path`` (a local directory, a URI, or a run's name in the default
    storage: see ``locate``), or raise a CLIError saying why."""
    if filesystem is None:
        path = locate(path)
    parent, name = split_run_path(path)
    storage = RunStorage.create(parent, name, filesystem)
    names = _entry_names(storage.filesystem, storage.run_path)
    if names is None:
        raise CLIError(
            f"No run at {path!r}: there is no such directory.\n"
            f"HINT: `phalanx ls {parent}` lists the runs there."
        )
    if not names & set(RUN_FILES):
        raise CLIError(_not_a_run(storage, path))
    return load_run(storage)


def locate(argument: str, run: bool = True) -> str:
    """The path a command's ``<run>`` argument stands for: the argument itself when it is a run
    directory, else the run of that name in the default storage (``$PHALANX_STORAGE_PATH`` or
    ``~/phalanx_results``, a URI too), as ``phalanx ls`` prints it. With ``run=False``
    (``phalanx serve``, which takes checkpoints too) any directory will do, a run first:
    ``demo/checkpoint_000004``. A URI or an absolute path is always taken as given. When
    neither exists, a CLIError lists the near names.

    Example::

        locate("demo")  # '/home/me/phalanx_results/demo' after `python examples/demo.py`
    """
    if "://" in argument or os.path.isabs(argument):
        return argument
    from phalanx._foundation.env import default_storage_path

    storage_path = default_storage_path()
    candidate = storage_path.rstrip("/") + "/" + argument
    kinds = {path: _kind(path) for path in (argument, candidate)}
    for wanted in ("run",) if run else ("run", "directory"):
        found = next((path for path, kind in kinds.items() if kind == wanted), None)
        if found is not None:
            return found
    if kinds[argument] is not None:  # a directory that is not a run: open_run says what it is
        return argument
    raise CLIError(_no_such_run(argument, storage_path))


def _kind(path: str) -> str | None:
    """``"run"``, ``"directory"`` or None (nothing there) for a local path or a URI."""
    if "://" not in path:
        if not os.path.isdir(path):
            return None
        return (
            "run"
            if any(os.path.exists(os.path.join(path, f)) for f in RUN_FILES)
            else ("directory")
        )
    fs, root = _resolve(path, None)
    names = _entry_names(fs, root)
    if names is None:
        return None
    return "run" if names & set(RUN_FILES) else "directory"


def _no_such_run(argument: str, storage_path: str) -> str:
    name = argument.rstrip("/").split("/", 1)[0]
    runs = [s.name for s in find_run_storages(storage_path, None)]
    near = difflib.get_close_matches(name, runs, n=5, cutoff=0.5)
    near += [r for r in runs if r.startswith(name[:3]) and r not in near][: 5 - len(near)]
    said = (
        f"No run at {argument!r}: there is no such directory here, and no run called "
        f"{name!r} in the default storage {storage_path} ($PHALANX_STORAGE_PATH or "
        "~/phalanx_results)."
    )
    if near:
        return f"{said}\nHINT: did you mean {', '.join(near)}? `phalanx ls` lists every run there."
    if runs:
        return f"{said}\nHINT: `phalanx ls` lists the {len(runs)} run(s) there; pass one of those names."
    return (
        f"{said}\nHINT: pass a run directory (result.path, i.e. <storage_path>/<name>); "
        "`phalanx ls <storage_path>` lists the runs of a storage path."
    )


def _not_a_run(storage: RunStorage, path: str) -> str:
    inside = [s.name for s in find_run_storages(storage.storage_path + "/" + storage.name, None)]
    if inside:
        shown = ", ".join(inside[:5]) + (", ..." if len(inside) > 5 else "")
        return (
            f"{path!r} is not a phalanx run directory; it is a storage path holding "
            f"{len(inside)} run(s): {shown}.\nHINT: `phalanx ls {path}` lists them; pass one "
            f"of them, e.g. {path.rstrip('/')}/{inside[0]}."
        )
    return (
        f"{path!r} is not a phalanx run directory (no {SNAPSHOT_FILE} or {RUN_FILE}).\n"
        "HINT: pass result.path, i.e. <storage_path>/<name>; `phalanx ls <storage_path>` lists "
        "the runs."
    )


def load_run(storage: RunStorage) -> RunView:
    reader = RunReader(storage)
    record = reader.record()
    manager = CheckpointManager(storage, _checkpoint_config(record))
    manager.load()
    status = reader.status(record, manager.attempt_history)
    return RunView(storage, record, manager, reader.history(), status, reader.error_text())


def _checkpoint_config(record: dict[str, Any] | None) -> CheckpointConfig:
    """The run's own ranking of checkpoints (so the CLI's "best" is the run's best)."""
    saved = ((record or {}).get("run_config") or {}).get("checkpoint_config") or {}
    with contextlib.suppress(Exception):
        return CheckpointConfig(
            checkpoint_score_attribute=saved.get("checkpoint_score_attribute"),
            checkpoint_score_order=saved.get("checkpoint_score_order", "max"),
        )
    return CheckpointConfig()


def find_run_storages(storage_path: str, filesystem: object) -> list[RunStorage]:
    """Every run directory directly under ``storage_path``."""
    fs, root = _resolve(storage_path, filesystem)
    root = root.rstrip("/") or "/"
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []
    except Exception as exc:
        raise storage_error("list", storage_path, exc) from exc
    runs = []
    for entry in entries:
        if entry.get("type") != "directory":
            continue
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        names = _entry_names(fs, f"{root}/{name}")
        if names and names & set(RUN_FILES):
            runs.append(RunStorage.create(root, name, fs))
    return runs


def find_runs(storage_path: str, filesystem: object = None) -> list[RunView]:
    """Every run under ``storage_path``; a CLIError when there is none, saying why."""
    fs, root = _resolve(storage_path, filesystem)
    if _entry_names(fs, root) is None:
        raise CLIError(
            f"{storage_path!r} does not exist.\nHINT: pass the storage_path your runs use "
            "(RunConfig(storage_path=...); default $PHALANX_STORAGE_PATH or ~/phalanx_results)."
        )
    storages = find_run_storages(storage_path, filesystem)
    if not storages:
        own = _entry_names(fs, root.rstrip("/")) or set()
        if own & set(RUN_FILES):
            raise CLIError(
                f"{storage_path!r} is a run directory, not a storage path.\n"
                f"HINT: `phalanx show {storage_path}` shows this run; `phalanx ls` takes the "
                "directory above it."
            )
        raise CLIError(
            f"No phalanx runs in {storage_path!r}.\nHINT: pass the storage_path your runs "
            "use (a run is a directory <storage_path>/<name> with a run.json)."
        )
    runs = []
    for storage in storages:
        try:
            runs.append(load_run(storage))
        except StorageError as exc:  # one damaged run must not hide the others
            logger.warning("Skipping run %r: %s", storage.name, exc)
    return runs


def _resolve(storage_path: str, filesystem: object) -> tuple[Any, str]:
    with storage_errors("open the storage at", storage_path):
        return resolve_filesystem(storage_path, filesystem)


def _entry_names(fs: Any, path: str) -> set[str] | None:
    """Names inside directory ``path``; None when it does not exist."""
    try:
        listing = fs.ls(path, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except Exception as exc:  # credentials, network: a StorageError with a HINT
        raise storage_error("list", path, exc) from exc
    if not listing and not fs.isdir(path):
        return None
    return {p.rstrip("/").rsplit("/", 1)[-1] for p in listing}

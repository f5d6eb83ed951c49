"""The run remembers its configuration: ``<run>/run.json``, written when ``fit()`` starts and
updated when it ends.

It holds ``train_loop_config``, the scaling, run, failure, checkpoint and backend configs, the
trainer's class and its constructor arguments that are plain data (``trainer``), the versions of phalanx, Python and the frameworks the driver imported, the driver's host and pid,
the start and end times and the status (``running``, ``finished``, ``failed``, ``interrupted``),
and ``config_error``, the first line of a ConfigError the run failed on (such a run, if it
committed no checkpoint, starts afresh at the next ``fit()`` instead of resuming).
Values JSON cannot hold are kept as ``{"__repr__": "..."}`` so the file always loads. Written
through :meth:`RunStore.write_atomic` (a rename locally, one PUT on object stores): a reader
sees the old or the new record, never a mix.

A driver killed with ``kill -9`` leaves ``"running"`` behind; :mod:`run_status` tells such a run
from a live one.

Example::

    with recorded_run(storage, describe_run(spec)):
        result = controller.run()
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import json
import logging
import os
import platform
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from phalanx._foundation.fs.access import storage_errors
from phalanx._internal.storage.commit_record import has_commit_records
from phalanx._internal.storage.run_storage import (
    ALL_RANKS_HISTORY_FILE,
    ERROR_PICKLE_FILE,
    ERROR_TEXT_FILE,
    HISTORY_FILE,
    SNAPSHOT_FILE,
)
from phalanx._internal.storage.snapshot_journal import JOURNAL_FILE, read_state
from phalanx._internal.storage.store import RunStore
from phalanx.errors import ConfigError, StorageError

if TYPE_CHECKING:
    from phalanx.config import RunConfig

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
RECORD_VERSION = 1
REPR_KEY = "__repr__"
FRAMEWORKS = ("torch", "xgboost", "lightgbm", "ray", "numpy", "pandas", "pyarrow")
STATUSES = ("running", "finished", "failed", "interrupted")


def json_safe(value: object) -> Any:
    """``value`` as JSON can hold it: configs (dataclasses) become dicts, enums their value, and
    anything else JSON cannot hold ``{"__repr__": repr(value)}``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, dict):
        return {_key(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    item = getattr(value, "item", None)  # numpy scalars, 0-d tensors
    if callable(item) and getattr(value, "ndim", None) == 0:
        with contextlib.suppress(Exception):
            return json_safe(item())
    return {REPR_KEY: _short_repr(value)}


def _key(key: object) -> str:
    return key if isinstance(key, str) else repr(key)


def _short_repr(value: object, limit: int = 500) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not stop the run
        text = f"<{type(value).__name__} (repr failed: {type(exc).__name__})>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_run(spec: Any, trainer: object = None) -> dict[str, Any]:
    """The configuration part of the record, from the controller's ``RunSpec`` and the trainer
    (its class and its own constructor arguments: see :func:`trainer_arguments`)."""
    record = {
        "name": spec.run_name,
        "train_loop_config": json_safe(spec.train_loop_config),
        "scaling_config": json_safe(spec.scaling_config),
        "run_config": _run_config(spec.run_config),
        "backend_config": {
            "type": _type_name(spec.backend_config),
            **json_safe(spec.backend_config),
        },
        "datasets": sorted(spec.dataset_names),
        "metadata": json_safe(spec.metadata),
    }
    if trainer is not None:
        record["trainer"] = trainer_arguments(trainer)
    return record


# Recorded under their own keys: not repeated under "trainer".
_RECORDED_APART = ("train_loop_config", "metadata")
# What a GBDT trainer runs with, given or defaulted (num_boost_round has a default).
_EFFECTIVE = ("label_column", "params", "num_boost_round")


def trainer_arguments(trainer: object) -> dict[str, Any]:
    """``{"type": class, **arguments}``: the constructor arguments given to ``trainer`` that are
    plain data (numbers, strings, lists and dicts of them, e.g. a GBDT trainer's ``params``,
    ``label_column`` and ``num_boost_round``); configs are recorded under their own keys, and
    functions and datasets are not data."""
    given = getattr(trainer, "_init_arguments", None) or {}
    plain = {k: v for k, v in given.items() if k not in _RECORDED_APART and _plain(v)}
    plain.update({k: getattr(trainer, k) for k in _EFFECTIVE if getattr(trainer, k, None)})
    return {"type": _public_name(type(trainer)), **json_safe(plain)}


def _public_name(cls: type) -> str:
    """``phalanx.xgboost.XGBoostTrainer``: where users import it from, not a private module."""
    parts = cls.__module__.split(".")
    public = list(itertools.takewhile(lambda part: not part.startswith("_"), parts)) or parts
    return ".".join([*public, cls.__qualname__])


def _plain(value: object) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _run_config(run_config: RunConfig) -> dict[str, Any]:
    """RunConfig with its failure and checkpoint configs; of a storage_filesystem only the type,
    since its repr may hold credentials."""
    rendered = {}
    for f in dataclasses.fields(run_config):
        value = getattr(run_config, f.name)
        if f.name == "storage_filesystem" and value is not None:
            rendered[f.name] = {REPR_KEY: _type_name(value)}
        else:
            rendered[f.name] = json_safe(value)
    return rendered


def _type_name(value: object) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def versions() -> dict[str, str]:
    """phalanx, Python, and each framework the driver has imported (never imports one)."""
    from phalanx._version import __version__

    found = {"phalanx": __version__, "python": platform.python_version()}
    for name in FRAMEWORKS:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if isinstance(version, str):
            found[name] = version
    return found


def driver() -> dict[str, Any]:
    """Who runs the run: host, pid and the pid's start time (tells a reused pid apart)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": process_start(os.getpid()),
        "user": _user(),
    }


def _user() -> str | None:
    with contextlib.suppress(Exception):
        import getpass

        return getpass.getuser()
    return None


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of stat(5)
    except (IndexError, ValueError):
        return None


def read_record(storage: RunStore) -> dict[str, Any] | None:
    """The run's record, or None when the run has none (a run from before records existed)."""
    raw = storage.read(RUN_FILE)
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError as exc:
        raise StorageError(
            f"{storage.path(RUN_FILE)!r} is not valid JSON ({exc}).\nHINT: the file was "
            "edited or damaged; the run's checkpoints and metrics are unaffected."
        ) from exc
    return record if isinstance(record, dict) else None


def _write(storage: RunStore, record: Mapping[str, object]) -> None:
    data = json.dumps(record, indent=2, allow_nan=True, default=_short_repr)
    storage.write_atomic(RUN_FILE, data.encode())


def start_record(storage: RunStore, config: Mapping[str, object]) -> dict[str, Any]:
    """Write the record of a ``fit()`` that starts now; a resumed run keeps its first start."""
    previous = None
    with contextlib.suppress(StorageError):
        previous = read_record(storage)
    now = time.time()
    record: dict[str, Any] = {
        "version": RECORD_VERSION,
        "status": "running",
        "started": now,
        "ended": None,
        "first_started": (previous or {}).get("first_started", now),
        "fits": int((previous or {}).get("fits", 0)) + 1,
        "driver": driver(),
        "versions": versions(),
        **config,
    }
    _write(storage, record)
    return record


def end_record(
    storage: RunStore, record: dict[str, Any], status: str, config_error: str | None = None
) -> None:
    record.update(status=status, ended=time.time(), config_error=config_error)
    _write(storage, record)


# What a fit() leaves besides checkpoints, logs and run.json: a fresh start goes without them
_RUN_STATE_FILES = (
    SNAPSHOT_FILE,
    JOURNAL_FILE,
    HISTORY_FILE,
    ALL_RANKS_HISTORY_FILE,
    ERROR_TEXT_FILE,
    ERROR_PICKLE_FILE,
)


def start_afresh_after_config_error(storage: RunStore) -> bool:
    """Whether the run's last ``fit()`` failed on a configuration error before committing a
    checkpoint; if so, what it left is removed, so the fit() that starts now (the error fixed)
    is a fresh run, not a resumed one. A checkpoint it committed is kept and resumed from."""
    record = None
    with contextlib.suppress(StorageError):
        record = read_record(storage)
    error = (record or {}).get("config_error")
    if not error or record is None or record.get("status") != "failed":
        return False
    try:
        state = read_state(storage)
    except (ValueError, KeyError, TypeError):  # damaged: the resume reports it
        return False
    if (state is not None and state.get("checkpoints")) or has_commit_records(storage):
        return False  # a committed checkpoint, in the index or by its own record: resumed
    # Set aside, never deleted: the failed fit()'s metrics are still the user's to read.
    aside = f"config_error_{time.strftime('%Y%m%d-%H%M%S')}"
    for relative in _RUN_STATE_FILES:
        path = storage.path(relative)
        with storage_errors("set aside", path):
            if storage.filesystem.exists(path):
                storage.filesystem.makedirs(storage.path(aside), exist_ok=True)
                storage.filesystem.mv(path, storage.path(aside, relative), recursive=True)
    logger.warning(
        "Starting run %r afresh, not resuming it: its last fit() failed on a configuration "
        "error before any checkpoint (%s). What it wrote is kept in %s.",
        storage.name,
        error,
        storage.path(aside),
    )
    return True


def status_of(exc: BaseException | None) -> str:
    if exc is None:
        return "finished"
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C (and SIGTERM, which phalanx turns into it)
        return "interrupted"
    return "failed"


@contextlib.contextmanager
def recorded_run(storage: RunStore, config: Mapping[str, object]) -> Iterator[dict[str, Any]]:
    """Write the record as ``running`` now and with the outcome when the block ends.

    The run matters more than its record: a storage too broken to update it at the end is
    logged, never raised over the run's own result or error."""
    record = start_record(storage, config)
    try:
        yield record
    except BaseException as exc:
        config_error = str(exc).split("\n", 1)[0] if isinstance(exc, ConfigError) else None
        _end_quietly(storage, record, status_of(exc), config_error)
        raise
    _end_quietly(storage, record, "finished")


def _end_quietly(
    storage: RunStore, record: dict[str, Any], status: str, config_error: str | None = None
) -> None:
    try:
        end_record(storage, record, status, config_error)
    except StorageError as exc:
        logger.error("Could not record the end of the run (%s): %s", status, exc)

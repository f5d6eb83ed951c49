"""``Trainer.restore(path)`` / ``can_restore(path)``: Ray's V1 names for resuming a run.

phalanx resumes any run started again with the same ``storage_path`` and ``name``; these map a
run directory to that pair.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from phalanx._internal.storage.run_storage import SNAPSHOT_FILE, RunStorage
from phalanx.config import RunConfig
from phalanx.errors import ConfigError


def split_run_path(path: str | os.PathLike[str]) -> tuple[str, str]:
    """``<storage_path>/<name>`` -> ``(storage_path, name)``."""
    text = os.fspath(path).rstrip("/")
    if "/" not in text:
        text = os.path.join(os.getcwd(), text)
    parent, name = text.rsplit("/", 1)
    if not name or not parent or parent.endswith(":/"):
        raise ConfigError(
            f"restore(path={os.fspath(path)!r}) is invalid: it must be a run directory, "
            "<storage_path>/<name>.\nHINT: pass result.path of the run."
        )
    return parent, name


def can_restore(path: str | os.PathLike[str], storage_filesystem: Any = None) -> bool:
    storage_path, name = split_run_path(path)
    storage = RunStorage.create(storage_path, name, storage_filesystem)
    return storage.read(SNAPSHOT_FILE) is not None


def restore_kwargs(trainer: str, path: str | os.PathLike[str], kwargs: dict[str, Any]) -> dict:
    """The trainer's keyword arguments with a RunConfig that points at the run in ``path``."""
    run_config = kwargs.pop("run_config", None) or RunConfig()
    filesystem = kwargs.pop("storage_filesystem", None) or run_config.storage_filesystem
    if not can_restore(path, filesystem):
        raise ConfigError(
            f"{trainer}.restore({os.fspath(path)!r}): there is no phalanx run there (no "
            f"{SNAPSHOT_FILE}).\nHINT: check {trainer}.can_restore(path) first, or pass "
            "result.path of an earlier run."
        )
    storage_path, name = split_run_path(path)
    kwargs["run_config"] = dataclasses.replace(
        run_config, name=name, storage_path=storage_path, storage_filesystem=filesystem
    )
    return kwargs

"""RunConfig and what it holds besides the other configs: LoggingConfig, SyncConfig, the run's
name and where it is stored."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phalanx._foundation.keywords import KeywordChecked
from phalanx.config._checkpoint import CheckpointConfig
from phalanx.config._checks import _fail, _is_int
from phalanx.config._failure import FailureConfig

if TYPE_CHECKING:
    from phalanx.callbacks import Callback


def _check_run_name(name: object) -> None:
    """The run directory is ``<storage_path>/<name>``: one path component, or it escapes."""
    from phalanx._foundation.fs.paths import RESERVED_PREFIX, component_problem

    problem = component_problem(name)
    if problem is None and isinstance(name, str) and name.startswith(RESERVED_PREFIX):
        problem = f"names starting with {RESERVED_PREFIX!r} are phalanx's own"
    if problem is not None:
        raise _fail(
            "RunConfig",
            "name",
            name,
            f"one directory name inside storage_path ({problem})",
            "use a plain name such as 'resnet_exp1' (no '/', '\\', '.' or '..').",
        )


@dataclass(frozen=True)
class LoggingConfig(KeywordChecked):
    """The level of phalanx's own log messages (the ``phalanx`` logger), e.g. ``"DEBUG"``.

    Example::

        RunConfig(logging_config=LoggingConfig(log_level="DEBUG"))
    """

    log_level: str = "INFO"

    def __post_init__(self) -> None:
        import logging

        level = self.log_level
        # getLevelName: a name's number, else the text "Level X" (getLevelNamesMapping is 3.11+)
        if not isinstance(level, str) or not isinstance(logging.getLevelName(level.upper()), int):
            raise _fail("LoggingConfig", "log_level", level, "a logging level name such as 'INFO'")
        object.__setattr__(self, "log_level", level.upper())


@dataclass(frozen=True)
class SyncConfig(KeywordChecked):
    """Accepted so Ray scripts run unchanged; it changes nothing.

    Every checkpoint goes to ``storage_path`` as it is reported, and every log and metric is
    written there directly, so there is nothing to sync on a timer.

    Example::

        RunConfig(sync_config=SyncConfig(sync_period=300))  # accepted, not needed
    """

    sync_period: int = 300
    sync_timeout: int = 1800
    sync_artifacts: bool = False
    sync_artifacts_on_checkpoint: bool = True


@dataclass(frozen=True)
class RunConfig(KeywordChecked):
    """Where a run lives and how it behaves.

    ``(storage_path, name)`` identifies a run: running again with the same pair resumes it from
    its latest checkpoint. ``storage_path`` defaults to ``$PHALANX_STORAGE_PATH`` or
    ``~/phalanx_results``; ``name`` to ``phalanx_run-<date>_<time>``.

    Example::

        RunConfig(name="exp", storage_path="/mnt/runs",
                  checkpoint_config=CheckpointConfig(num_to_keep=2))
    """

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    callbacks: list[Callback] = field(default_factory=list)
    worker_runtime_env: dict[str, Any] | None = None
    logging_config: LoggingConfig | None = None
    sync_config: SyncConfig | None = None
    verbose: int = 1

    def __post_init__(self) -> None:
        if self.name is not None:
            _check_run_name(self.name)
        _check_storage_path(self.storage_path, known_protocols=self.storage_filesystem is None)
        _check_storage_filesystem(self.storage_filesystem)
        if not _is_int(self.verbose) or not 0 <= self.verbose <= 3:
            raise _fail("RunConfig", "verbose", self.verbose, "an integer from 0 to 3")
        if self.failure_config is None:
            object.__setattr__(self, "failure_config", FailureConfig())
        if self.checkpoint_config is None:
            object.__setattr__(self, "checkpoint_config", CheckpointConfig())
        if not isinstance(self.failure_config, FailureConfig):
            raise _fail("RunConfig", "failure_config", self.failure_config, "a FailureConfig")
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise _fail(
                "RunConfig", "checkpoint_config", self.checkpoint_config, "a CheckpointConfig"
            )
        self._validate_callbacks()
        from phalanx._foundation.config_checks import validate_runtime_env

        validate_runtime_env(self.worker_runtime_env)
        if self.logging_config is not None and not isinstance(self.logging_config, LoggingConfig):
            raise _fail(
                "RunConfig", "logging_config", self.logging_config, "None or a LoggingConfig"
            )
        if self.sync_config is not None and not isinstance(self.sync_config, SyncConfig):
            raise _fail("RunConfig", "sync_config", self.sync_config, "None or a SyncConfig")

    def _validate_callbacks(self) -> None:
        from phalanx.callbacks import Callback

        callbacks = self.callbacks if self.callbacks is not None else []
        if not isinstance(callbacks, list | tuple):
            raise _fail("RunConfig", "callbacks", callbacks, "a list of phalanx.Callback objects")
        object.__setattr__(self, "callbacks", list(callbacks))
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise _fail(
                    "RunConfig",
                    "callbacks",
                    self.callbacks,
                    "a list of phalanx.Callback objects",
                    f"{type(callback).__name__} is not a phalanx.Callback; subclass it.",
                )


def _check_storage_path(path: object, known_protocols: bool) -> None:
    """None, a local path, or a URI whose protocol fsspec knows (installed or not: a missing
    package is a StorageError at fit(), with fsspec's install hint). With a storage_filesystem
    the protocol is that filesystem's business."""
    if path is None:
        return
    if not isinstance(path, str | os.PathLike):
        raise _fail("RunConfig", "storage_path", path, "None, a path or a URI string")
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise _fail(
            "RunConfig",
            "storage_path",
            path,
            "None (the default location) or a non-empty path or URI",
            "leave storage_path unset for $PHALANX_STORAGE_PATH or ~/phalanx_results.",
        )
    if "://" in text and known_protocols:
        import fsspec

        protocol = text.split("://", 1)[0]
        if protocol not in fsspec.available_protocols():
            raise _fail(
                "RunConfig",
                "storage_path",
                path,
                "a local path or a URI with a protocol fsspec knows (s3://, gs://, file://, ...)",
                f"{protocol!r} is not a known protocol; check the spelling.",
            )


def _check_storage_filesystem(filesystem: object) -> None:
    if filesystem is None:
        return
    import fsspec

    if isinstance(filesystem, fsspec.AbstractFileSystem):
        return
    if type(filesystem).__module__.startswith("pyarrow"):
        import pyarrow.fs as pafs

        if isinstance(filesystem, pafs.FileSystem):
            return
    raise _fail(
        "RunConfig",
        "storage_filesystem",
        filesystem,
        "None, an fsspec filesystem or a pyarrow.fs.FileSystem",
    )

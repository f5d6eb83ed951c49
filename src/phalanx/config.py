"""User configuration: ScalingConfig, RunConfig, FailureConfig, CheckpointConfig, DataConfig.

Names, fields and meaning follow Ray Train. Every config is a frozen dataclass validated at
construction: a bad value raises :class:`~phalanx.errors.ConfigError` naming the field, the value
and what is allowed, long before any worker starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from phalanx._internal.keywords import KeywordChecked
from phalanx.errors import ConfigError

if TYPE_CHECKING:
    from phalanx.callbacks import Callback

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "FailureConfig",
    "LoggingConfig",
    "RunConfig",
    "ScalingConfig",
    "SyncConfig",
]

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ENGINES = ("local", "ray", "thread")


def _fail(cls: str, name: str, value: Any, allowed: str, hint: str = "") -> ConfigError:
    message = f"{cls}({name}={value!r}) is invalid: {name} must be {allowed}."
    return ConfigError(message + (f"\nHINT: {hint}" if hint else ""))


def _check_run_name(name: Any) -> None:
    """The run directory is ``<storage_path>/<name>``: one path component, or it escapes."""
    from phalanx._internal.fs.paths import RESERVED_PREFIX, component_problem

    problem = component_problem(name)
    if problem is None and name.startswith(RESERVED_PREFIX):
        problem = f"names starting with {RESERVED_PREFIX!r} are phalanx's own"
    if problem is not None:
        raise _fail(
            "RunConfig",
            "name",
            name,
            f"one directory name inside storage_path ({problem})",
            "use a plain name such as 'resnet_exp1' (no '/', '\\', '.' or '..').",
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """int or float, not bool: ``hang_timeout_s=True`` is a mistake, not one second."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_hang_timeout(value: Any) -> bool:
    """``"auto"``, None, or a finite number of seconds >= 0 (0: off, as None)."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return True
    return _is_number(value) and value >= 0 and not math.isinf(value)


def _check_num_workers(value: Any) -> None:
    """An int >= 0, or ``(min_workers, max_workers)`` ints with 1 <= min <= max (elastic)."""
    if isinstance(value, tuple):
        if len(value) != 2 or not all(_is_int(v) for v in value):
            raise _fail(
                "ScalingConfig",
                "num_workers",
                value,
                "an integer >= 0 or a (min_workers, max_workers) tuple of two integers",
                "for elastic training pass two ints, e.g. num_workers=(2, 8).",
            )
        low, high = value
        if not 1 <= low <= high:
            raise _fail(
                "ScalingConfig",
                "num_workers",
                value,
                "(min_workers, max_workers) with 1 <= min_workers <= max_workers",
                f"swap or raise the bounds, e.g. num_workers=({max(1, min(value))}, "
                f"{max(1, *value)}).",
            )
        return
    if not _is_int(value) or value < 0:
        raise _fail(
            "ScalingConfig",
            "num_workers",
            value,
            "an integer >= 0 (0: run the training function in this process)",
        )


def _check_resources(cls: str, name: str, resources: Any) -> None:
    """None or a dict of resource name to a number >= 0 (no bools, no NaN)."""
    if resources is None:
        return
    allowed = "None or a dict of resource name to a number >= 0"
    if not isinstance(resources, dict):
        raise _fail(cls, name, resources, allowed)
    for key, amount in resources.items():
        if not isinstance(key, str) or not key or not _is_number(amount) or not amount >= 0:
            raise _fail(cls, name, resources, allowed, f"{key!r}: {amount!r} is not allowed.")


@dataclass(frozen=True)
class ScalingConfig(KeywordChecked):
    """How many workers to start and what each one gets.

    Example::

        ScalingConfig(num_workers=4, use_gpu=True, resources_per_worker={"CPU": 2, "GPU": 1})

    ``engine`` picks where workers run: ``"local"`` (processes on this machine), ``"ray"`` (Ray
    actors) or ``"thread"`` (threads in the driver, for tests). ``None`` picks Ray when Ray is
    initialised or ``RAY_ADDRESS`` is set, local processes otherwise.

    ``num_workers=(min_workers, max_workers)`` is elastic training, as in Ray: on Ray each attempt
    starts with as many workers as the cluster can place (at most ``max_workers``, waiting while
    fewer than ``min_workers`` fit), and a node loss restarts the group, from the latest
    checkpoint, at the size that still fits. Locally the size is decided once at ``fit()`` from
    this machine's CPUs (GPUs with ``use_gpu=True``). Every ``elastic_resize_monitor_interval_s``
    a healthy group below ``max_workers`` restarts larger from the latest checkpoint when more
    workers fit (not a failure).
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    trainer_resources: dict[str, float] | None = None
    accelerator_type: str | None = None
    label_selector: dict[str, str] | list[dict[str, str]] | None = None
    use_tpu: bool = False
    topology: str | None = None
    elastic_resize_monitor_interval_s: float = 60.0
    engine: str | None = None

    def __post_init__(self) -> None:
        _check_num_workers(self.num_workers)
        from phalanx._internal.config_checks import validate_placement_fields

        validate_placement_fields(self)
        if not isinstance(self.use_gpu, bool):
            raise _fail("ScalingConfig", "use_gpu", self.use_gpu, "True or False")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise _fail(
                "ScalingConfig",
                "placement_strategy",
                self.placement_strategy,
                f"one of {', '.join(PLACEMENT_STRATEGIES)}",
            )
        if self.engine is not None and self.engine not in ENGINES:
            raise _fail("ScalingConfig", "engine", self.engine, f"None or one of {ENGINES}")
        _check_resources("ScalingConfig", "trainer_resources", self.trainer_resources)
        accelerator = self.accelerator_type
        if accelerator is not None and (not isinstance(accelerator, str) or not accelerator):
            raise _fail(
                "ScalingConfig",
                "accelerator_type",
                accelerator,
                "None or an accelerator name such as 'A100'",
            )
        self._validate_resources()

    def _validate_resources(self) -> None:
        resources = self.resources_per_worker
        if resources is None:
            return
        _check_resources("ScalingConfig", "resources_per_worker", resources)
        gpus = resources.get("GPU", 0)
        if gpus > 0 and not self.use_gpu:
            raise _fail(
                "ScalingConfig",
                "resources_per_worker",
                resources,
                "without GPU when use_gpu=False",
                "set use_gpu=True to request GPUs.",
            )
        if self.use_gpu and "GPU" in resources and gpus == 0:
            raise _fail(
                "ScalingConfig", "resources_per_worker", resources, "with GPU > 0 when use_gpu=True"
            )

    @property
    def _resources_per_worker_not_none(self) -> dict[str, float]:
        if self.resources_per_worker is None:
            if self.use_tpu:
                return {"TPU": 1}
            return {"GPU": 1} if self.use_gpu else {"CPU": 1}
        resources = {k: v for k, v in self.resources_per_worker.items() if v != 0}
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        return resources

    @property
    def min_workers(self) -> int:
        n = self.num_workers
        return n[0] if isinstance(n, tuple) else n

    @property
    def max_workers(self) -> int:
        n = self.num_workers
        return n[1] if isinstance(n, tuple) else n

    @property
    def elasticity_enabled(self) -> bool:
        """``num_workers=(min, max)``: the group size is decided per attempt (elastic training)."""
        return isinstance(self.num_workers, tuple)

    @property
    def num_tpus_per_worker(self) -> float:
        return float(self._resources_per_worker_not_none.get("TPU", 0))

    @property
    def num_cpus_per_worker(self) -> float:
        return float(self._resources_per_worker_not_none.get("CPU", 0))

    @property
    def num_gpus_per_worker(self) -> float:
        return float(self._resources_per_worker_not_none.get("GPU", 0))

    @property
    def additional_resources_per_worker(self) -> dict[str, float]:
        return {
            k: v for k, v in self._resources_per_worker_not_none.items() if k not in ("CPU", "GPU")
        }

    @property
    def total_resources(self) -> dict[str, float]:
        """What the workers reserve in all (elastic: an upper bound, at max_workers, as in Ray)."""
        return {k: v * self.max_workers for k, v in self._resources_per_worker_not_none.items()}


@dataclass(frozen=True)
class FailureConfig(KeywordChecked):
    """What happens when an attempt fails: retry from the latest checkpoint, or raise.

    Two budgets, counted separately:

    - ``max_failures``: application failures, i.e. an exception in user code, a worker that
      died (killed by a signal, out of memory) or hung. ``-1`` retries forever.
    - ``max_preemption_failures``: infrastructure failures, i.e. a worker told to stop by
      SIGTERM (spot or node preemption). ``-1`` (the default) retries forever.

    ``hang_timeout_s``: ranks that make no progress (no ``report()``, no return) for this long
    are declared hung; the error names them, the rank that held the others up, and shows every
    rank's Python stack. ``"auto"`` (default) adapts to the run: the larger of a floor
    (``PHALANX_HANG_TIMEOUT_FLOOR_S``, 30 min) and 10x the slowest round seen so far; before
    any rank has reported, 4x the floor (compilation, data loading). ``None`` or ``0`` turns the
    watchdog off; a number of seconds fixes it (larger than your longest gap between reports).

    ``preemption_grace_s``: after a preemption notice, how long the ranks get to reach the stop
    round (and save a checkpoint) before they are killed.

    Accepted for Ray scripts, with nothing to configure in phalanx: ``controller_failure_limit``
    (the controller is your driver process: if it dies your script ends, and running it again
    resumes the run) and ``relax_collectives_on_preemption`` (``report()`` is never a barrier:
    surviving ranks always commit the stop round without the preempted ones).

    Example::

        FailureConfig(max_failures=2, hang_timeout_s=600)
    """

    max_failures: int = 0
    controller_failure_limit: int = -1
    max_preemption_failures: int = -1
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 30.0
    hang_timeout_s: float | Literal["auto"] | None = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.relax_collectives_on_preemption, bool):
            raise _fail(
                "FailureConfig",
                "relax_collectives_on_preemption",
                self.relax_collectives_on_preemption,
                "True or False",
            )
        for name in ("max_failures", "controller_failure_limit", "max_preemption_failures"):
            value = getattr(self, name)
            if not _is_int(value) or value < -1:
                raise _fail("FailureConfig", name, value, "an integer >= -1 (-1: retry forever)")
        hang = self.hang_timeout_s
        if not _is_hang_timeout(hang):
            raise _fail(
                "FailureConfig",
                "hang_timeout_s",
                hang,
                '"auto" (the default rule), None or 0 (no watchdog), or a finite number of '
                "seconds > 0",
            )
        grace = self.preemption_grace_s
        if not _is_number(grace) or not grace >= 0 or math.isinf(grace):
            raise _fail(
                "FailureConfig", "preemption_grace_s", grace, "a finite number of seconds >= 0"
            )


@dataclass(frozen=True)
class CheckpointConfig(KeywordChecked):
    """Which checkpoints to keep.

    With ``checkpoint_score_attribute`` the ``num_to_keep`` best by that metric are kept (the
    latest is always kept until a newer one commits); without it, the newest ``num_to_keep``.
    ``checkpoint_frequency``/``checkpoint_at_end`` apply to trainers that own the loop (GBDT).
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (not _is_int(self.num_to_keep) or self.num_to_keep < 1):
            raise _fail(
                "CheckpointConfig", "num_to_keep", self.num_to_keep, "None or an integer >= 1"
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise _fail(
                "CheckpointConfig",
                "checkpoint_score_order",
                self.checkpoint_score_order,
                "'max' or 'min'",
            )
        attr = self.checkpoint_score_attribute
        if attr is not None and (not isinstance(attr, str) or not attr):
            raise _fail(
                "CheckpointConfig", "checkpoint_score_attribute", attr, "None or a metric name"
            )
        if not _is_int(self.checkpoint_frequency) or self.checkpoint_frequency < 0:
            raise _fail(
                "CheckpointConfig",
                "checkpoint_frequency",
                self.checkpoint_frequency,
                "an integer >= 0",
            )
        if self.checkpoint_at_end is not None and not isinstance(self.checkpoint_at_end, bool):
            raise _fail(
                "CheckpointConfig",
                "checkpoint_at_end",
                self.checkpoint_at_end,
                "None, True or False",
            )


@dataclass(frozen=True)
class DataConfig(KeywordChecked):
    """Which datasets are split across ranks (``"all"`` or a list of names); others go whole.

    ``execution_options``: Ray Data ``ExecutionOptions`` (one for all datasets, or a dict by
    name), set on Ray Data datasets as Ray Train does; on phalanx's own datasets
    ``resource_limits.object_store_memory`` caps each shard's read-ahead in bytes (see
    ``phalanx.data.ExecutionOptions``). ``enable_shard_locality``: Ray Data's locality hints (on Ray).
    ``equal_split`` (default True, as Ray's ``streaming_split(equal=True)``): every rank gets
    the same number of rows, so DDP ranks run the same number of steps; the ``rows % world_size``
    left over are left out. False keeps every row (ranks may differ by one): for inference.
    ``resume_position`` (default True; or a dict of dataset name -> bool, others True): when an
    attempt starts from a checkpoint (a retry, a rerun, ``resume_from_checkpoint``, a resize),
    each split phalanx dataset continues its epoch where the checkpoint was taken: the rows of
    the epoch no rank had consumed are split over the new world size, and the following passes
    are the next epochs. False: every attempt starts a fresh epoch 0, as in Ray.

    Example::

        options = DataConfig.default_ingest_options()
        options.resource_limits = options.resource_limits.copy(object_store_memory=256 << 20)
        DataConfig(datasets_to_split=["train"], execution_options=options)
    """

    datasets_to_split: Literal["all"] | list[str] = "all"
    execution_options: Any = None
    enable_shard_locality: bool = True
    equal_split: bool = True
    resume_position: bool | dict[str, bool] = True

    def __post_init__(self) -> None:
        split = self.datasets_to_split
        if split != "all" and not (
            isinstance(split, list | tuple) and all(isinstance(s, str) for s in split)
        ):
            raise _fail("DataConfig", "datasets_to_split", split, "'all' or a list of names")
        options = self.execution_options
        values = options.values() if isinstance(options, dict) else [options]
        if options is not None and not all(hasattr(o, "resource_limits") for o in values):
            raise _fail(
                "DataConfig",
                "execution_options",
                options,
                "an ExecutionOptions, a dict of dataset name -> ExecutionOptions, or None",
                "start from DataConfig.default_ingest_options().",
            )
        for name in ("enable_shard_locality", "equal_split"):
            if not isinstance(getattr(self, name), bool):
                raise _fail("DataConfig", name, getattr(self, name), "True or False")
        resume = self.resume_position
        if not isinstance(resume, bool) and not (
            isinstance(resume, dict)
            and all(isinstance(k, str) and isinstance(v, bool) for k, v in resume.items())
        ):
            raise _fail(
                "DataConfig",
                "resume_position",
                resume,
                "True, False or a dict of dataset name -> True/False",
            )

    def resumes(self, name: str) -> bool:
        """Whether dataset ``name`` continues its epoch from a checkpoint (``resume_position``)."""
        resume = self.resume_position
        return resume.get(name, True) if isinstance(resume, dict) else resume

    @staticmethod
    def default_ingest_options() -> Any:
        """Ray's default execution options for training ingest (the driver's Ray Data
        options when Ray Data is in use; otherwise ``phalanx.data.ExecutionOptions``)."""
        from phalanx._internal.execution_options import default_ingest_options

        return default_ingest_options()


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
        from phalanx._internal.config_checks import validate_runtime_env

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


def _check_storage_path(path: Any, known_protocols: bool) -> None:
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


def _check_storage_filesystem(filesystem: Any) -> None:
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

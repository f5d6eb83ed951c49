"""DataParallelTrainer: run one training function on every worker and return a Result."""

from __future__ import annotations

import inspect
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from phalanx._fit.picklable import check_picklable
from phalanx._foundation import env
from phalanx._foundation.keywords import KeywordChecked
from phalanx._internal.worker.code_origins import dump_function
from phalanx.backend import BackendConfig
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.validation import ValidationConfig

if TYPE_CHECKING:
    # What fit() runs is imported by fit(): `import phalanx.torch` stays light (issue 19).
    from phalanx._internal.engines.base import Engine
    from phalanx._internal.storage.run_storage import RunStorage
    from phalanx.result import Result

__all__ = ["BaseTrainer", "DataParallelTrainer"]

logger = logging.getLogger(__name__)

# A training function that pickles larger than this captured something big (an array, a
# dataset): every worker then unpickles it at start, which makes fit() slow without a word.
LARGE_TRAIN_FN_BYTES = 50_000_000

_Trainer = TypeVar("_Trainer", bound="BaseTrainer")


class BaseTrainer(KeywordChecked):
    """Shared by every trainer: configuration checks at construction, ``fit()``, and Ray's
    ``restore``/``can_restore`` (a run resumes from its directory).

    Example::

        path = "~/phalanx_results/exp"
        if TorchTrainer.can_restore(path):
            result = TorchTrainer.restore(path, train_loop_per_worker=train_func).fit()
    """

    # What restore() rebuilds the trainer from (saved by fit(), as Ray V1's trainer.pkl).
    _init_arguments: dict[str, object] | None

    def __new__(cls: type[_Trainer], *args: object, **kwargs: object) -> _Trainer:
        from phalanx._fit.restore import init_arguments

        trainer = super().__new__(cls, *args, **kwargs)
        trainer._init_arguments = init_arguments(cls, args, kwargs)
        return trainer

    def fit(self) -> Result:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def can_restore(cls, path: str | os.PathLike[str], storage_filesystem: object = None) -> bool:
        """Whether ``path`` (a run directory, ``result.path``) holds a run to resume."""
        from phalanx._fit.restore import can_restore

        return can_restore(path, storage_filesystem)

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        train_loop_per_worker: Callable[..., object] | None = None,
        train_loop_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> BaseTrainer:
        """A trainer that resumes the run in ``path`` from its latest checkpoint when ``fit()``
        is called (phalanx resumes any run started again with the same ``storage_path`` and
        ``name``; this is that, from the run's directory).

        As in Ray, ``fit()`` saved the trainer's arguments in the run directory
        (``trainer.pkl``): they are used again, except those given here. Datasets are saved by
        key only: pass ``datasets=`` again, with the same keys. ``run_config`` may be given;
        its ``name`` and ``storage_path`` are set from ``path``. ``trainer.pkl`` is a pickle:
        restoring runs code from the run directory, so restore only runs you trust (as Ray).

        Example::

            if TorchTrainer.can_restore(path):
                trainer = TorchTrainer.restore(path, datasets={"train": ds})
            result = trainer.fit()
        """
        from phalanx._fit.restore import restore_kwargs

        if train_loop_per_worker is not None:
            kwargs["train_loop_per_worker"] = train_loop_per_worker
        if train_loop_config is not None:
            kwargs["train_loop_config"] = train_loop_config
        return cls(**restore_kwargs(cls, path, kwargs))


class DataParallelTrainer(BaseTrainer):
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` workers.

    Configuration is checked here, at construction; ``fit()`` starts the workers, streams their
    reports and checkpoints into storage, and returns a :class:`~phalanx.Result` (or raises
    :class:`~phalanx.TrainingFailedError`, whose ``.result`` holds what was saved).

    ``preprocessor`` (a ``phalanx.preprocess`` Preprocessor) is fitted on ``datasets["train"]``
    unless fitted already, applied to every dataset the workers read, and saved in every
    checkpoint, where predictors apply it to raw input.

    Example::

        def train_func(config):
            for step in range(config["steps"]):
                phalanx.report({"step": step})

        result = DataParallelTrainer(
            train_func, train_loop_config={"steps": 10},
            scaling_config=ScalingConfig(num_workers=2),
        ).fit()
    """

    _default_backend_config: Callable[[], BackendConfig] = BackendConfig

    def __init__(
        self,
        train_loop_per_worker: Callable[..., object],
        *,
        train_loop_config: dict[str, Any] | None = None,
        backend_config: BackendConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        preprocessor: Any = None,
        validation_config: ValidationConfig | None = None,
    ) -> None:
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.backend_config = backend_config or self._default_backend_config()
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        _check_mapping("datasets", datasets)
        _check_mapping("metadata", metadata)
        self.datasets = dict(datasets or {})
        self.dataset_config = dataset_config or DataConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.metadata = dict(metadata or {})
        self.preprocessor = preprocessor
        self.validation_config = validation_config
        self._validate()
        # num_workers=0 calls the function as is, in this process: it need not pickle
        in_process = self.scaling_config.num_workers == 0
        self._payload = b"" if in_process else _pickle_train_fn(train_loop_per_worker)
        if not in_process:  # before any run directory exists
            check_picklable("train_loop_config", self.train_loop_config)

    def _validate(self) -> None:
        _check_type("scaling_config", self.scaling_config, ScalingConfig)
        _check_type("run_config", self.run_config, RunConfig)
        _check_type("backend_config", self.backend_config, BackendConfig)
        _check_type("dataset_config", self.dataset_config, DataConfig)
        if self.resume_from_checkpoint is not None:
            _check_type("resume_from_checkpoint", self.resume_from_checkpoint, Checkpoint)
        if self.validation_config is not None:
            _check_type("validation_config", self.validation_config, ValidationConfig)
        if self.train_loop_config is not None and not isinstance(self.train_loop_config, dict):
            raise ConfigError(
                f"train_loop_config={self.train_loop_config!r} is invalid: it must be a dict "
                "(or None)."
            )
        _check_train_fn(self.train_loop_per_worker)
        if self.datasets:
            from phalanx.data._ingest import validate_datasets

            validate_datasets(self.datasets, self.dataset_config)
        _check_metadata(self.metadata)
        if self.preprocessor is not None:
            from phalanx.preprocess._attach import check_preprocessor

            check_preprocessor(self.preprocessor)

    def fit(self) -> Result:
        from phalanx._fit.frozen_gc import objects_before_frozen

        try:
            with objects_before_frozen():  # before fit()'s imports allocate: see the module
                return self._fit_with_signals()
        except KeyboardInterrupt as exc:
            # The user pressed Ctrl-C: show where their program was, not phalanx's internals
            # (the workers are stopped and a line said how to resume).
            raise exc.with_traceback(None) from None
        except ConfigError as exc:
            # The user's configuration is wrong (found once the run started, e.g. a
            # checkpoint_score_attribute no report has): phalanx's frames do not help.
            raise exc.with_traceback(None) from exc.__cause__

    def _fit_with_signals(self) -> Result:
        from phalanx._fit.logs import console_logging
        from phalanx._foundation.run_scope import fit_scope
        from phalanx._internal.controller.interrupt import sigterm_interrupts

        # fit_scope: a sweep's trial sets the run's defaults and waits for its workers' share
        # sigterm: a `kill` of the driver stops the run like Ctrl-C
        with fit_scope(self), sigterm_interrupts(), console_logging(self.run_config):
            return self._fit()

    def _fit(self) -> Result:
        from phalanx._fit.elastic_size import resolve_locally
        from phalanx._foundation.config_checks import check_runtime_env_locally
        from phalanx._internal.engines.choose import resolve_engine
        from phalanx._internal.storage.run_lock import RunLock
        from phalanx._internal.storage.run_storage import RunStorage

        started = time.time()  # the goodput's start-up counts from here
        run_config = self.run_config
        name = run_config.name or default_run_name()
        engine = resolve_engine(self.scaling_config)
        scaling = self.scaling_config
        if not engine.sizes_elastic_groups:  # (min, max): this machine's size, decided once
            scaling = resolve_locally(scaling)
        engine.check(scaling)
        if engine.applies_runtime_env:
            check_runtime_env_locally(run_config.worker_runtime_env)
        checkpoint_files = self._checkpoint_files()
        storage = RunStorage.create(
            run_config.storage_path or env.default_storage_path(),
            name,
            run_config.storage_filesystem,
        )
        lock = RunLock.acquire(storage)  # before anything in the run directory is touched
        try:
            return self._fit_locked(engine, scaling, storage, name, checkpoint_files, started)
        finally:
            lock.release()

    def _checkpoint_files(self) -> dict[str, bytes]:
        """Files added to every checkpoint: the preprocessor, fitted on the train dataset (its
        fitted statistics must pickle too: that fails here, before training)."""
        if self.preprocessor is None:
            return {}
        from phalanx.preprocess._attach import PREPROCESSOR_FILENAME, fit_on_train, serialize

        fit_on_train(self.preprocessor, self.datasets)
        return {PREPROCESSOR_FILENAME: serialize(self.preprocessor)}

    def _fit_locked(
        self,
        engine: Engine,
        scaling: ScalingConfig,
        storage: RunStorage,
        name: str,
        checkpoint_files: dict[str, bytes],
        started: float | None = None,
    ) -> Result:
        from phalanx._fit.restore import save_trainer
        from phalanx._fit.shards import DatasetShards
        from phalanx._internal.controller.controller import Controller
        from phalanx._internal.controller.resume import log_resume
        from phalanx._internal.controller.spec import RunSpec
        from phalanx._internal.storage.checkpoint_manager import CheckpointManager
        from phalanx._internal.storage.run_record import (
            describe_run,
            recorded_run,
            start_afresh_after_config_error,
        )

        run_config = self.run_config
        storage.prepare()
        start_afresh_after_config_error(storage)  # a fixed config error is not resumed
        save_trainer(storage, self)  # what restore(path) rebuilds this trainer from
        manager = CheckpointManager(storage, run_config.checkpoint_config)
        resumed = manager.load()
        if manager.recover_unindexed().reindexed or resumed:  # a lost index re-indexed: resumed
            log_resume(name, manager)
        shards = DatasetShards(self.datasets, self.dataset_config, self.preprocessor)
        spec = RunSpec(
            train_fn_payload=self._payload,
            train_loop_config=self.train_loop_config,
            backend_config=self.backend_config,
            scaling_config=scaling,
            run_config=run_config,
            run_name=name,
            metadata=self.metadata,
            resume_from_checkpoint=self.resume_from_checkpoint,
            make_shards=shards,
            dataset_positions=shards,
            resume_data_position=self.dataset_config.resume_position is not False,
            dataset_names=tuple(str(key) for key in self.datasets),
            checkpoint_files=checkpoint_files,
            start_timeout_s=env.worker_start_timeout_s(),
            validation_config=self.validation_config,
            train_fn=self.train_loop_per_worker,
            total_rounds=getattr(self, "num_boost_round", None),
        )
        with recorded_run(storage, describe_run(spec, self)) as record:  # <run>/run.json
            controller = Controller(spec, engine, storage, manager)
            record["stragglers"] = controller.stragglers.periods  # filled as the run goes
            controller.record = record  # the goodput breakdown is added at the end
            controller.goodput.began = started or controller.goodput.began
            return controller.run()


def default_run_name() -> str:
    """Ray's pattern plus a random suffix, so that two fit() calls never share a run directory
    (``phalanx_run-2026-11-22_22-40-42.123-1a2b3c``)."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now))
    return f"phalanx_run-{stamp}.{int(now % 1 * 1000):03d}-{secrets.token_hex(3)}"


def _check_type(field: str, value: object, expected: type) -> None:
    if not isinstance(value, expected):
        raise ConfigError(
            f"{field}={value!r} is invalid: it must be a phalanx.{expected.__name__}.\n"
            f"HINT: import {expected.__name__} from phalanx (not from ray.train)."
        )


def _check_train_fn(fn: object) -> None:
    if not callable(fn):
        raise ConfigError(f"train_loop_per_worker={fn!r} is invalid: it must be a function.")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    required = [
        p
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        raise ConfigError(
            f"train_loop_per_worker takes {len(required)} required arguments "
            f"({', '.join(p.name for p in required)}); it must take none or one (the config dict)."
        )


def _check_mapping(field: str, value: object) -> None:
    if value is not None and not isinstance(value, dict):
        example = "{'train': dataset}" if field == "datasets" else "{'key': 'value'}"
        raise ConfigError(
            f"{field}={_short(value)} is invalid: it must be a dict (or None).\n"
            f"HINT: pass {field}={example}."
        )


def _check_metadata(metadata: dict[str, Any]) -> None:
    """Metadata is written into every checkpoint as JSON: check that now, not at the first
    commit."""
    try:
        json.dumps(metadata, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"metadata={_short(metadata)} is invalid: it must be a dict JSON can hold "
            f"({exc}).\nHINT: use str keys and numbers, strings, lists and dicts as values."
        ) from exc
    for key in metadata:
        if not isinstance(key, str):
            raise ConfigError(
                f"metadata={_short(metadata)} is invalid: key {key!r} is not a string.\n"
                "HINT: use str keys (JSON would turn them into strings)."
            )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _pickle_train_fn(fn: Callable[..., object]) -> bytes:
    try:
        payload = dump_function(fn)
    except Exception as exc:
        raise ConfigError(
            f"train_loop_per_worker cannot be pickled to send it to the workers: "
            f"{type(exc).__name__}: {exc}.\nHINT: the function (or something it uses from an "
            "enclosing scope, e.g. a lock, an open file or a model on a GPU) must be picklable; "
            "create such objects inside the training function instead."
        ) from exc
    if len(payload) > LARGE_TRAIN_FN_BYTES:  # the pickle is made anyway: this costs nothing
        logger.warning(
            "train_loop_per_worker pickles to %.0f MB, sent to every worker at every attempt: "
            "it captures a large object from an enclosing scope (a dataset, an array, a model)."
            "\nHINT: load the object inside the training function, or pass data through "
            "datasets= (each worker then reads only its shard).",
            len(payload) / 1e6,
        )
    return payload

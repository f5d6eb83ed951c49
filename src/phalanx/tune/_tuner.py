"""``Tuner``: runs a sweep of trials over a trainable (Ray Tune's ``Tuner``).

The trainable is a function of the trial's config: it reports with ``tune.report`` (a
function trainable) or builds and fits a phalanx Trainer with ``TuneReportCallback`` (Ray Train
V2's form); or it is a Trainer itself, each trial's ``param_space["train_loop_config"]`` merged
into its ``train_loop_config`` (Ray's AIR form).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

import cloudpickle

from phalanx._foundation import env
from phalanx.config import RunConfig as TrainRunConfig
from phalanx.errors import ConfigError
from phalanx.tune._config import RunConfig, TuneConfig
from phalanx.tune._result_grid import ResultGrid
from phalanx.tune._space import copy_space
from phalanx.tune._state import STATE_FILE, TUNER_FILE
from phalanx.tune._sweep import Sweep
from phalanx.tune._trainable import trainable_name
from phalanx.tune._trial import Trial

__all__ = ["Tuner"]

logger = logging.getLogger(__name__)


class Tuner:
    """A sweep: ``num_samples`` trials of ``param_space``, searched by ``search_alg`` and
    stopped early by ``scheduler``, in ``<storage_path>/<name>/``.

    Example::

        tuner = tune.Tuner(
            trainable,
            param_space={"lr": tune.loguniform(1e-4, 1e-1)},
            tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=8),
        )
        best = tuner.fit().get_best_result()
    """

    def __init__(
        self,
        trainable: Any = None,
        *,
        param_space: dict[str, Any] | None = None,
        tune_config: TuneConfig | None = None,
        run_config: RunConfig | TrainRunConfig | None = None,
        _trials: list[Trial] | None = None,
        _path: str | None = None,
    ) -> None:
        from phalanx.trainer import BaseTrainer

        if not (callable(trainable) or isinstance(trainable, BaseTrainer)):
            raise ConfigError(
                f"Tuner({trainable!r}) is invalid: the trainable must be a function of the "
                "trial's config, or a phalanx Trainer.\nHINT: Tuner(train_fn, param_space=...)."
            )
        if isinstance(trainable, type):
            raise ConfigError(
                f"Tuner({trainable.__name__}) is a class: class trainables (tune.Trainable) "
                "are not supported.\nHINT: pass a function that calls tune.report(), or a "
                "Trainer instance."
            )
        if param_space is not None and not isinstance(param_space, dict):
            raise ConfigError(f"Tuner(param_space={param_space!r}) must be a dict.")
        tune_config = tune_config or TuneConfig()
        if not isinstance(tune_config, TuneConfig):
            raise ConfigError(f"Tuner(tune_config={tune_config!r}) must be a tune.TuneConfig.")
        if run_config is None and isinstance(trainable, BaseTrainer):
            run_config = getattr(trainable, "run_config", None)  # Ray's AIR form: its RunConfig
        self.trainable = trainable
        self.param_space = copy_space(param_space or {})
        self.tune_config = tune_config
        self.run_config = _tune_run_config(run_config)
        self._trials = _trials
        name = (
            self.run_config.name
            or f"{trainable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
        )
        self._path = _path or os.path.join(_local_storage(self.run_config.storage_path), name)
        self._name = name
        self._results: ResultGrid | None = None

    def fit(self) -> ResultGrid:
        """Runs the sweep to its end (trials that fail are in ``ResultGrid.errors``)."""
        sweep = Sweep(
            self.trainable,
            self.param_space,
            self.tune_config,
            self.run_config,
            self._path,
            self._name,
            trials=self._trials,
        )
        if self._trials is None:
            os.makedirs(self._path, exist_ok=True)
            self._save_tuner()
        trials = sweep.run()
        self._trials = trials
        self._results = ResultGrid(
            trials, self._path, self.tune_config.metric, self.tune_config.mode
        )
        return self._results

    def get_results(self) -> ResultGrid:
        if self._results is None:
            if self._trials is None:
                raise RuntimeError("The sweep has not run yet.\nHINT: call tuner.fit() first.")
            return ResultGrid(
                self._trials, self._path, self.tune_config.metric, self.tune_config.mode
            )
        return self._results

    def _save_tuner(self) -> None:
        run_config = dataclasses.replace(self.run_config, callbacks=[])
        try:
            payload = cloudpickle.dumps(
                {
                    "param_space": self.param_space,
                    "tune_config": self.tune_config,
                    "run_config": run_config,
                }
            )
        except Exception as exc:
            logger.warning(
                "The sweep cannot be restored: its configuration does not pickle (%s: %s).",
                type(exc).__name__, exc,
            )  # fmt: skip
            return
        staging = os.path.join(self._path, f"{TUNER_FILE}.tmp")
        with open(staging, "wb") as f:
            f.write(payload)
        os.replace(staging, os.path.join(self._path, TUNER_FILE))

    @classmethod
    def can_restore(cls, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` holds a sweep that ``Tuner.restore`` can go on with."""
        path = os.fspath(path)
        return os.path.isfile(os.path.join(path, TUNER_FILE)) and os.path.isfile(
            os.path.join(path, STATE_FILE)
        )

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        trainable: Any,
        *,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
        param_space: dict[str, Any] | None = None,
    ) -> Tuner:
        """The sweep at ``path`` (after its driver was killed): ``fit()`` finishes it. Finished
        trials are not run again; unfinished ones go on from their latest checkpoint;
        ``resume_errored``/``restart_errored`` run failed ones again (from their checkpoint /
        from scratch).

        Example::

            if tune.Tuner.can_restore(path):
                tuner = tune.Tuner.restore(path, trainable=train_fn)
            grid = tuner.fit()
        """
        path = os.fspath(path)
        if path.startswith("file://"):
            path = path[len("file://") :]
        _local_storage(path)  # a sweep on S3: the same error as Tuner(storage_path=...)
        if not cls.can_restore(path):
            raise ConfigError(
                f"Tuner.restore({path!r}): no sweep to restore there (it needs {TUNER_FILE} and "
                f"{STATE_FILE}).\nHINT: pass the sweep's directory, <storage_path>/<name>."
            )
        with open(os.path.join(path, TUNER_FILE), "rb") as f:
            saved = cloudpickle.loads(f.read())
        with open(os.path.join(path, STATE_FILE)) as f:
            state = json.load(f)
        name = state.get("name") or os.path.basename(path.rstrip("/"))
        trials = [Trial.from_json(t, name, path) for t in state.get("trials", [])]
        for trial in trials:
            if trial.status == "ERROR" and (resume_errored or restart_errored):
                trial.status = "PENDING"
                trial.error = None
                trial.num_failures = 0
                if restart_errored:
                    trial.results, trial.checkpoint_path = [], None
                    trial.checkpoint_filesystem = None
                    trial.iterations_at_checkpoint = 0
            elif not trial.is_finished() and not resume_unfinished:
                trial.status = "ERROR"
                trial.error = "not resumed (Tuner.restore(resume_unfinished=False))"
        run_config = dataclasses.replace(saved["run_config"], name=name)
        return cls(
            trainable,
            param_space=param_space if param_space is not None else saved["param_space"],
            tune_config=saved["tune_config"],
            run_config=run_config,
            _trials=trials,
            _path=path,
        )


def _tune_run_config(run_config: Any) -> RunConfig:
    if run_config is None:
        return RunConfig()
    if isinstance(run_config, RunConfig):
        return run_config
    if isinstance(run_config, TrainRunConfig):  # Ray's AIR form took Train's RunConfig
        return RunConfig(
            name=run_config.name,
            storage_path=run_config.storage_path,
            storage_filesystem=run_config.storage_filesystem,
            failure_config=run_config.failure_config,
            checkpoint_config=run_config.checkpoint_config,
        )
    raise ConfigError(f"Tuner(run_config={run_config!r}) must be a tune.RunConfig.")


def _local_storage(storage_path: str | None) -> str:
    path = storage_path or env.default_storage_path()
    if path.startswith("file://"):
        path = path[len("file://") :]
    if "://" in path:
        raise ConfigError(
            f"RunConfig(storage_path={path!r}): a sweep's own directory (its state, "
            f"{TUNER_FILE}, function trainables' checkpoints) is on a local or mounted path "
            "for now.\nHINT: use a local directory (a mounted shared filesystem for several "
            "hosts); the trials' Train runs can still store on S3: give the Trainer's "
            "RunConfig(storage_path='s3://...')."
        )
    return os.path.abspath(os.path.expanduser(path))

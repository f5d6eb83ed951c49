"""SklearnTrainer: one scikit-learn estimator fitted on one worker (AIR's ``SklearnTrainer``)."""

from __future__ import annotations

import functools
from typing import Any

from sklearn.base import BaseEstimator, clone

from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.sklearn._checkpoint import load_estimator
from phalanx.sklearn._estimator import cpu_params
from phalanx.sklearn._loop import CV_GROUPS, TRAIN, SklearnSpec, fit_loop
from phalanx.trainer import DataParallelTrainer, _check_type

__all__ = ["SklearnTrainer"]

TRAINER = "SklearnTrainer"


class SklearnTrainer(DataParallelTrainer):
    """Fits a scikit-learn estimator on ``datasets["train"]`` in one worker (scikit-learn is
    single-node), scores it on every other dataset and, with ``cv``, cross-validates it on the
    training data; reports everything once and saves a :class:`SklearnCheckpoint`.

    CPUs are ``scaling_config.trainer_resources["CPU"]`` (default 1), the only resources it
    takes, as in AIR: they become the estimator's ``n_jobs``/``thread_count`` (nested ones too;
    ``set_estimator_cpus=False`` leaves them) and, with ``parallelize_cv`` (by default: when
    the estimator has no such parameter), the number of folds fitted side by side. joblib runs
    them: its local loky backend, or Ray's joblib backend on the Ray engine.

    Metrics, as AIR named them: ``fit_time``; per other dataset ``<name>/test_score`` (or
    ``<name>/test_<scorer>`` for each of several ``scoring``) and ``<name>/score_time``; with
    ``cv``: ``cv/test_score`` (one value per fold), ``cv/test_score_mean``,
    ``cv/test_score_std``, ``cv/fit_time_mean``, ... (``cv/train_score*`` with
    ``return_train_score_cv``). A ``"cv_groups"`` column of the training data is the groups of
    a ``Group*`` splitter. ``fit_params`` go to ``estimator.fit``.

    A failed worker (``FailureConfig(max_failures=...)``) fits again from the start: there is
    no checkpoint before the fit ends. A finished run started again fits nothing.

    Example::

        from sklearn.ensemble import RandomForestRegressor
        from phalanx.sklearn import SklearnTrainer

        trainer = SklearnTrainer(
            estimator=RandomForestRegressor(),
            label_column="y",
            datasets={"train": train_df, "valid": valid_df},
            cv=3,
            scaling_config=phalanx.ScalingConfig(trainer_resources={"CPU": 4}),
        )
        result = trainer.fit()
        result.metrics["valid"]["test_score"], result.metrics["cv"]["test_score_mean"]
        estimator = SklearnTrainer.get_model(result.checkpoint)
    """

    def __init__(
        self,
        estimator: BaseEstimator,
        *,
        datasets: dict[str, Any],
        label_column: str | None = None,
        params: dict[str, Any] | None = None,
        scoring: object = None,
        cv: object = None,
        return_train_score_cv: bool = False,
        parallelize_cv: bool | None = None,
        set_estimator_cpus: bool = True,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        preprocessor: object = None,
        metadata: dict[str, Any] | None = None,
        **fit_params: object,
    ) -> None:
        if "resume_from_checkpoint" in fit_params:
            raise ConfigError(
                f"{TRAINER} got resume_from_checkpoint, which it does not take (as in Ray): "
                "an estimator is fitted in one go.\nHINT: drop it; a run started again with "
                "the same RunConfig(name=..., storage_path=...) keeps its fitted estimator."
            )
        scaling = scaling_config or ScalingConfig()
        _check_type("scaling_config", scaling, ScalingConfig)
        _check_arguments(estimator, datasets, label_column, params, return_train_score_cv)
        cpus, gpus = _trainer_resources(scaling)
        parallel = _parallelize_cv(estimator, cv, parallelize_cv, gpus > 0)
        self.estimator = clone(estimator)
        self.label_column = label_column
        self.params = dict(params or {})
        self.scoring = scoring
        self.cv = cv
        self.return_train_score_cv = return_train_score_cv
        self.parallelize_cv = parallelize_cv
        self.set_estimator_cpus = set_estimator_cpus
        self.fit_params = fit_params
        spec = SklearnSpec(
            estimator=_with_params(self.estimator, self.params),
            label_column=label_column,
            dataset_names=(TRAIN, *(str(n) for n in datasets if n != TRAIN)),
            scoring=scoring,
            cv=cv,
            return_train_score_cv=return_train_score_cv,
            parallelize_cv=parallel,
            set_estimator_cpus=set_estimator_cpus,
            cpus=cpus,
            fit_params=dict(fit_params),
        )
        super().__init__(
            functools.partial(fit_loop, spec),
            scaling_config=_worker_scaling(scaling, cpus, gpus),
            run_config=run_config,
            datasets=datasets,
            dataset_config=DataConfig(datasets_to_split=[]),
            metadata=metadata,
            preprocessor=preprocessor,
        )

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> BaseEstimator:
        """The fitted estimator saved in a checkpoint of this trainer (``result.checkpoint``)."""
        return load_estimator(checkpoint)


def _check_arguments(
    estimator: object,
    datasets: object,
    label_column: object,
    params: object,
    return_train_score_cv: object,
) -> None:
    if not (hasattr(estimator, "fit") and hasattr(estimator, "get_params")):
        raise ConfigError(
            f"{TRAINER}(estimator={estimator!r}) is invalid: it must be a scikit-learn "
            "compatible estimator (with fit and get_params).\nHINT: pass an unfitted "
            "estimator, e.g. RandomForestClassifier()."
        )
    if not isinstance(datasets, dict) or TRAIN not in datasets:
        given = sorted(datasets) if isinstance(datasets, dict) else datasets
        raise ConfigError(
            f"{TRAINER} needs datasets={{'train': ...}} (given: {given!r}).\nHINT: name the "
            "training data 'train'; every other dataset is scored."
        )
    if "cv" in datasets:
        raise ConfigError(
            f"{TRAINER} got a dataset named 'cv': the name is reserved for the "
            "cross-validation metrics.\nHINT: rename that dataset."
        )
    if label_column is not None and (not isinstance(label_column, str) or not label_column):
        raise ConfigError(
            f"{TRAINER}(label_column={label_column!r}) is invalid: it must name the label "
            "column of the datasets, or be None (nothing is scored)."
        )
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"{TRAINER}(params={params!r}) is invalid: it must be a dict or None.")
    if not isinstance(return_train_score_cv, bool):
        raise ConfigError(
            f"{TRAINER}(return_train_score_cv={return_train_score_cv!r}) is invalid: it must "
            "be True or False."
        )
    _check_label(datasets, label_column)


def _check_label(datasets: dict[str, object], label_column: object) -> None:
    """Every dataset given as a table has the label column: checked before any worker starts
    (data known only later, a function or a Ray dataset, is checked by the fit)."""
    from phalanx._gbdt.checks import head_frame

    if label_column is None:
        return
    for name, value in datasets.items():
        head = head_frame(value, rows=1)
        if head is not None and label_column not in head.columns:
            raise ConfigError(
                f"{TRAINER}(label_column={label_column!r}): datasets[{name!r}] has no such "
                f"column (it has {list(head.columns)[:20]}).\nHINT: check the spelling; with "
                f"a preprocessor, the label column must be in the raw data. (A {CV_GROUPS!r} "
                "column of 'train' is the cross-validation groups.)"
            )


def _trainer_resources(scaling: ScalingConfig) -> tuple[int, float]:
    """The trainer's CPUs and GPUs; ScalingConfig's worker fields are refused, as in AIR."""
    default = ScalingConfig()
    changed = [
        name
        for name in ("num_workers", "use_gpu", "resources_per_worker", "use_tpu")
        if getattr(scaling, name) != getattr(default, name)
    ]
    if changed:
        raise ConfigError(
            f"{TRAINER} got ScalingConfig({', '.join(f'{n}={getattr(scaling, n)!r}' for n in changed)}): "
            "scikit-learn fits on one node, so only trainer_resources (and engine) may be set "
            "(as in Ray, where the others are not allowed to be updated).\nHINT: use "
            "ScalingConfig(trainer_resources={'CPU': 4}) to give the estimator 4 CPUs."
        )
    resources = dict(scaling.trainer_resources or {"CPU": 1})
    cpus = resources.get("CPU", 1)
    if cpus < 1:
        raise ConfigError(
            f"{TRAINER} got ScalingConfig(trainer_resources={resources!r}): the fit needs at "
            "least one CPU.\nHINT: set trainer_resources={'CPU': n} with n >= 1."
        )
    return int(cpus), float(resources.get("GPU", 0))


def _worker_scaling(scaling: ScalingConfig, cpus: int, gpus: float) -> ScalingConfig:
    """The one worker, holding the trainer's resources."""
    resources = {k: v for k, v in (scaling.trainer_resources or {}).items() if v}
    resources["CPU"] = cpus
    return ScalingConfig(
        num_workers=1,
        use_gpu=gpus > 0,
        resources_per_worker=resources,
        placement_strategy=scaling.placement_strategy,
        accelerator_type=scaling.accelerator_type,
        label_selector=scaling.label_selector,
        engine=scaling.engine,
    )


def _parallelize_cv(
    estimator: BaseEstimator, cv: object, parallelize_cv: object, has_gpus: bool
) -> bool:
    """Ray's rule: parallelise the folds when asked, or (unasked, without GPUs) when the
    estimator has no CPU parameter to use the CPUs itself."""
    if parallelize_cv is not None and not isinstance(parallelize_cv, bool):
        raise ConfigError(
            f"{TRAINER}(parallelize_cv={parallelize_cv!r}) is invalid: it must be True, False "
            "or None (decide from the estimator)."
        )
    if cv and parallelize_cv and has_gpus:
        raise ConfigError(
            f"{TRAINER}(parallelize_cv=True) cannot be used with GPUs in trainer_resources: "
            "the folds would share the GPU.\nHINT: leave parallelize_cv=None or False."
        )
    if not cv:
        return False
    if parallelize_cv is None:
        return not has_gpus and not cpu_params(estimator)
    return parallelize_cv


def _with_params(estimator: BaseEstimator, params: dict[str, object]) -> BaseEstimator:
    """A clone of ``estimator`` with ``params`` set; a bad name fails here, not in the worker."""
    fitted = clone(estimator)
    try:
        return fitted.set_params(**params)
    except ValueError as exc:
        raise ConfigError(
            f"{TRAINER}(params={params!r}) cannot be set on {estimator!r}: {exc}\nHINT: use "
            "the estimator's parameter names (estimator.get_params())."
        ) from exc

"""What SklearnTrainer's one worker does: read the datasets, fit the estimator with the
trainer's CPUs, score it, cross-validate it, and report everything once with a checkpoint."""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from phalanx._foundation import env
from phalanx.sklearn._estimator import CPU_PARAM_NAMES

if TYPE_CHECKING:
    import pandas as pd
    from sklearn.base import BaseEstimator

    from phalanx.sklearn._estimator import Labelled

__all__ = ["CV_GROUPS", "TRAIN", "SklearnSpec", "fit_loop"]

logger = logging.getLogger(__name__)

TRAIN = "train"
CV_GROUPS = "cv_groups"  # a train column of group labels for a Group* splitter, as in Ray
# The training data's features, label and cross-validation groups (None: not given).
Train = tuple["pd.DataFrame | None", "pd.Series | None", "pd.Series | None"]
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "BLIS_NUM_THREADS",
)


@dataclass(frozen=True)
class SklearnSpec:
    """Everything the worker needs; pickled to it. ``estimator`` is an unfitted clone with
    ``params`` set; ``parallelize_cv`` is decided (Ray's rule) on the driver."""

    estimator: BaseEstimator
    label_column: str | None
    dataset_names: tuple[str, ...]
    scoring: object = None  # as scikit-learn takes it: a name, a scorer, a list or dict of them
    cv: object = None  # as scikit-learn takes it: a fold count or a splitter
    return_train_score_cv: bool = False
    parallelize_cv: bool = False
    set_estimator_cpus: bool = True
    cpus: int = 1
    fit_params: dict[str, object] = field(default_factory=dict)

    @property
    def cv_jobs(self) -> int:
        """Folds run side by side when cross-validation is parallelised, else one at a time
        (the estimator's own ``n_jobs`` uses the CPUs)."""
        return self.cpus if self.parallelize_cv else 1


def fit_loop(spec: SklearnSpec, config: dict[str, object] | None = None) -> None:
    """On the one worker: fit, score, cross-validate, report ``fit_time``, ``<dataset>/...``,
    ``cv/...`` and the checkpoint. A run resumed after it finished fits nothing again."""
    import phalanx.session as session
    from phalanx.sklearn._checkpoint import SklearnCheckpoint
    from phalanx.sklearn._estimator import cv_aggregates, score_datasets, set_cpu_params

    if session.get_checkpoint() is not None:
        logger.info("The run already has its fitted estimator (a checkpoint); nothing to fit.")
        return
    train, evals = _read_datasets(spec)
    features, label, groups = train
    estimator = spec.estimator
    if spec.set_estimator_cpus:
        set_cpu_params(estimator, spec.cpus)
    for name in THREAD_VARIABLES:
        # BLAS/OpenMP threads of loky's workers (scikit-learn's "Parallelism" page), as AIR set
        # them; a value the user set wins, as for TorchTrainer's OMP_NUM_THREADS.
        env.set_default(name, str(spec.cpus))
    with _joblib_backend(spec.cpus), _quiet_cpu_deprecations(spec):
        start = time.perf_counter()
        estimator.fit(features, label, **spec.fit_params)
        metrics: dict[str, object] = {"fit_time": time.perf_counter() - start}
        if spec.label_column is not None:
            metrics.update(score_datasets(estimator, spec.scoring, evals))
            if spec.cv:
                metrics["cv"] = cv_aggregates(_cross_validate(spec, features, label, groups))
    metrics["done"] = True
    with tempfile.TemporaryDirectory(prefix="phalanx_sklearn_") as directory:
        checkpoint = SklearnCheckpoint.from_estimator(estimator, path=directory)
        session.report(metrics, checkpoint=checkpoint)


def _cross_validate(
    spec: SklearnSpec,
    features: pd.DataFrame | None,
    label: pd.Series | None,
    groups: pd.Series | None,
) -> dict[str, object]:
    from sklearn.base import clone
    from sklearn.model_selection import cross_validate

    from phalanx.sklearn._estimator import set_cpu_params

    estimator = clone(spec.estimator)
    if spec.parallelize_cv and spec.set_estimator_cpus:
        # The folds share the CPUs; the final fit above had them all (Ray gave it one).
        set_cpu_params(estimator, 1)
    return dict(
        cross_validate(
            estimator,
            features,
            label,
            groups=groups,
            scoring=spec.scoring,
            cv=spec.cv,
            n_jobs=spec.cv_jobs,
            params=spec.fit_params or None,
            return_train_score=spec.return_train_score_cv,
        )
    )


def _read_datasets(spec: SklearnSpec) -> tuple[Train, dict[str, Labelled]]:
    """``(features, label, cv groups)`` of ``"train"`` and ``{name: (features, label)}`` of
    the others, read whole from this worker's shards (it is the only worker)."""
    import phalanx.session as session

    evals: dict[str, Labelled] = {}
    train: Train = (None, None, None)
    for name in spec.dataset_names:
        df = session.get_dataset_shard(name).to_pandas()
        label = None
        if spec.label_column is not None:
            label = df[spec.label_column]
            df = df.drop(columns=[spec.label_column])
        if name == TRAIN:
            groups = df.pop(CV_GROUPS) if CV_GROUPS in df.columns else None
            train = (df, label, groups)
        else:
            evals[name] = (df, label)
    return train, evals


@contextlib.contextmanager
def _quiet_cpu_deprecations(spec: SklearnSpec) -> Iterator[None]:
    """scikit-learn 1.8 deprecated some estimators' ``n_jobs`` (LogisticRegression's) and warns
    "You provided 'n_jobs=...'" when it is set: phalanx set it, not the user, so say nothing."""
    with warnings.catch_warnings():
        if spec.set_estimator_cpus:
            names = "|".join(CPU_PARAM_NAMES)
            warnings.filterwarnings(
                "ignore", message=f"'({names})' has no effect", category=FutureWarning
            )
        yield


@contextlib.contextmanager
def _joblib_backend(cpus: int) -> Iterator[None]:
    """On a Ray actor, Ray's joblib backend (as AIR's SklearnTrainer); elsewhere joblib's own
    default (loky processes, or threads where the estimator asks for them)."""
    if not _in_ray_actor():
        yield
        return
    from joblib import parallel_backend
    from ray.util.joblib import register_ray

    register_ray()
    with parallel_backend("ray", n_jobs=cpus):
        yield


def _in_ray_actor() -> bool:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None

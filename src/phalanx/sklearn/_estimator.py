"""What SklearnTrainer does to an estimator: its CPU parameters, and scoring it.

Written against scikit-learn's public API only (``check_scoring`` takes every form of
``scoring`` since scikit-learn 1.4, and ``cross_validate`` takes ``params=``).
"""

from __future__ import annotations

import logging
import time
import traceback
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.metrics import check_scoring

__all__ = ["CPU_PARAM_NAMES", "cpu_params", "cv_aggregates", "score_datasets", "set_cpu_params"]

logger = logging.getLogger(__name__)

# ``n_jobs``: scikit-learn's own; ``thread_count``: CatBoost's (as in Ray).
CPU_PARAM_NAMES = ("n_jobs", "thread_count")

# One scored dataset: its features and its label column.
Labelled = tuple[pd.DataFrame, "pd.Series | None"]


def cpu_params(estimator: BaseEstimator) -> list[str]:
    """The names of ``estimator``'s CPU parameters, nested ones included (``"clf__n_jobs"``).

    >>> from sklearn.ensemble import RandomForestRegressor
    >>> from sklearn.linear_model import Ridge
    >>> from sklearn.pipeline import make_pipeline
    >>> cpu_params(make_pipeline(Ridge(), RandomForestRegressor()))
    ['randomforestregressor__n_jobs']
    """
    return [
        name
        for name in estimator.get_params(deep=True)
        if any(name == p or name.endswith(f"__{p}") for p in CPU_PARAM_NAMES)
    ]


def set_cpu_params(estimator: BaseEstimator, cpus: int) -> BaseEstimator:
    """Set every CPU parameter of ``estimator`` (nested ones included) to ``cpus``."""
    names = cpu_params(estimator)
    if names:
        estimator.set_params(**dict.fromkeys(names, cpus))
    return estimator


def score_datasets(
    estimator: BaseEstimator, scoring: object, datasets: dict[str, Labelled]
) -> dict[str, dict[str, object]]:
    """``{name: {"score_time": s, "test_<scorer>": value, ...}}`` for every dataset, as Ray's
    SklearnTrainer reported them (``test_score`` for a single scorer). A scorer that fails on
    a dataset gives NaN and a warning, not a failed run."""
    results: dict[str, dict[str, object]] = {}
    if not datasets:
        return results
    scorer = check_scoring(estimator, scoring=scoring)
    for name, (features, label) in datasets.items():
        start = time.perf_counter()
        try:
            scores = scorer(estimator, features, label)
        except Exception:
            scores = _nan_like(scoring)
            warnings.warn(
                f"Scoring on validation set {name} failed; its score(s) are NaN. Details:\n"
                f"{traceback.format_exc()}",
                UserWarning,
                stacklevel=2,
            )
        row: dict[str, object] = {"score_time": time.perf_counter() - start}
        if not isinstance(scores, dict):
            scores = {"score": scores}
        row.update({f"test_{key}": _plain(value) for key, value in scores.items()})
        results[name] = row
    return results


def cv_aggregates(cv_results: Mapping[str, object]) -> dict[str, object]:
    """Ray's ``cv`` metrics: every per-fold array of ``cross_validate``, plus its
    ``<name>_mean`` and ``<name>_std`` (NaN folds ignored)."""
    out: dict[str, object] = {}
    aggregates: dict[str, float] = {}
    for key, values in cv_results.items():
        if not isinstance(values, np.ndarray):
            continue  # the fitted estimators or the split indices, if asked for
        out[key] = values.tolist()
        try:
            aggregates[f"{key}_mean"] = float(np.nanmean(values))
            aggregates[f"{key}_std"] = float(np.nanstd(values))
        except TypeError:
            logger.warning("Cannot aggregate the cross-validation results %r.", key)
            aggregates[f"{key}_mean"] = aggregates[f"{key}_std"] = float("nan")
    return {**out, **aggregates}


def _nan_like(scoring: object) -> float | dict[object, float]:
    if isinstance(scoring, dict):
        return dict.fromkeys(scoring, float("nan"))
    if isinstance(scoring, list | tuple | set):
        return dict.fromkeys(scoring, float("nan"))
    return float("nan")


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value

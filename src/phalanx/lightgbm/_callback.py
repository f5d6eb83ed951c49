"""ReportCallback: report LightGBM's eval metrics every boosting round, and save checkpoints."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import lightgbm

from phalanx._internal.gbdt.reporting import (
    MetricsArg,
    ReportSettings,
    flatten_metrics,
    send_report,
)
from phalanx.checkpoint import Checkpoint

__all__ = ["RayTrainReportCallback", "ReportCallback"]

FRAMEWORK = "lightgbm"


class ReportCallback:
    """A ``lightgbm.train`` callback that reports each round's eval metrics with
    ``phalanx.report`` (named ``<valid name>-<metric>``: ``train-binary_logloss``,
    ``valid-auc``) and saves the model as a checkpoint every ``frequency`` rounds and after the
    last round.

    LightGBM computes metrics on each worker's own data: give every worker the whole
    evaluation set (``DataConfig(datasets_to_split=["train"])``, what ``LightGBMTrainer`` does
    by default) so that every rank reports, and early-stops on, the same numbers. Only rank 0
    writes the model. When early stopping ends training before the last round, LightGBM calls
    no callback again: call :meth:`after_training` with the booster to save the final
    checkpoint (``LightGBMTrainer`` does); it adds ``best_iteration`` and ``best_score``.

    Example::

        def train_func():
            callback = ReportCallback(frequency=10)
            booster = lightgbm.train(params, train_set, 100, valid_sets=[valid_set],
                                     valid_names=["valid"], callbacks=[callback])
            callback.after_training(booster)

        booster = ReportCallback.get_model(result.checkpoint)
    """

    CHECKPOINT_NAME = "model.txt"
    # Run after record_evaluation (20) and before early_stopping (30), whose exception would
    # otherwise skip the report of the round that stops training.
    order = 25
    before_iteration = False

    def __init__(
        self,
        metrics: MetricsArg = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self._settings = ReportSettings(
            type(self).__name__,
            metrics,
            filename,
            frequency,
            checkpoint_at_end,
            results_postprocessing_fn,
        )
        self._last_metrics: dict[str, Any] = {}
        self._last_saved_rounds: int | None = None
        self._finished = False

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> lightgbm.Booster:
        """The booster saved in ``checkpoint`` by this callback (or by LightGBMTrainer)."""
        with checkpoint.as_directory() as directory:
            return lightgbm.Booster(model_file=os.path.join(directory, filename))

    def __call__(self, env: Any) -> None:
        settings = self._settings
        self._last_metrics = settings.select(flatten_metrics(_evals(env.evaluation_result_list)))
        last = env.iteration == env.end_iteration - 1
        if settings.checkpoint_due(env.iteration) or (last and settings.checkpoint_at_end):
            self._last_saved_rounds = env.iteration + 1
            send_report(self._last_metrics, _saver(env.model), settings.filename, FRAMEWORK)
        else:
            send_report(self._last_metrics, None, settings.filename, FRAMEWORK)

    def after_training(self, booster: lightgbm.Booster) -> lightgbm.Booster:
        """After ``lightgbm.train`` returns: save the final checkpoint if the last round did not
        (early stopping, or ``num_boost_round=0``). Call it on every rank."""
        if self._finished:
            return booster
        self._finished = True
        metrics = {**self._last_metrics, **best_of(booster)}
        just_saved = self._last_saved_rounds == booster.current_iteration()
        if self._settings.checkpoint_at_end and not just_saved:
            send_report(metrics, _saver(booster), self._settings.filename, FRAMEWORK)
        elif metrics != self._last_metrics:  # early stopping: say which round was best
            send_report(metrics, None, self._settings.filename, FRAMEWORK)
        return booster


RayTrainReportCallback = ReportCallback
"""Ray Train's name for :class:`ReportCallback`."""


def best_of(booster: lightgbm.Booster) -> dict[str, Any]:
    """``best_iteration`` (1-based, as LightGBM counts) and ``best_score`` after early stopping."""
    if booster.best_iteration <= 0:
        return {}
    best: dict[str, Any] = {"best_iteration": int(booster.best_iteration)}
    train_name = getattr(booster, "_train_data_name", "training")
    evals = {k: v for k, v in booster.best_score.items() if k != train_name}
    scores = flatten_metrics(evals)
    if scores:
        best["best_score"] = next(iter(scores.values()))
    return best


def _evals(results: list[tuple[Any, ...]]) -> dict[str, dict[str, Any]]:
    """LightGBM's ``(data name, metric, value, higher is better[, stdv])`` list as nested dicts
    (cross-validation results give ``-mean`` and ``-stdv`` entries)."""
    evals: dict[str, dict[str, Any]] = {}
    for entry in results:
        data_name, metric, value = entry[0], entry[1], entry[2]
        if len(entry) > 4:
            evals.setdefault(data_name, {})[f"{metric}-mean"] = value
            evals[data_name][f"{metric}-stdv"] = entry[4]
        else:
            evals.setdefault(data_name, {})[metric] = value
    return evals


def _saver(booster: lightgbm.Booster) -> Callable[[str], None]:
    def save(path: str) -> None:
        booster.save_model(path)

    return save

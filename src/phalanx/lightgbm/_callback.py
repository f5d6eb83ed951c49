"""ReportCallback: report LightGBM's eval metrics every boosting round, and save checkpoints."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import lightgbm

from phalanx._foundation.checkpoint_files import MODEL_FILES
from phalanx._gbdt.reporting import (
    Metrics,
    MetricsArg,
    ReportingCore,
    ReportSettings,
    flatten_metrics,
)
from phalanx.checkpoint import Checkpoint

if TYPE_CHECKING:
    from lightgbm.basic import EvalResult
    from lightgbm.callback import CallbackEnv

__all__ = ["RayTrainReportCallback", "ReportCallback"]

FRAMEWORK = "lightgbm"


def load_booster(path: str) -> lightgbm.Booster:
    """The booster saved in file ``path``."""
    return lightgbm.Booster(model_file=path)


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

    CHECKPOINT_NAME = MODEL_FILES[FRAMEWORK][0]
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
        results_postprocessing_fn: Callable[[Metrics], Metrics] | None = None,
    ) -> None:
        settings = ReportSettings(
            type(self).__name__,
            metrics,
            filename,
            frequency,
            checkpoint_at_end,
            results_postprocessing_fn,
        )
        self._core = ReportingCore(settings, FRAMEWORK)

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> lightgbm.Booster:
        """The booster saved in ``checkpoint`` by this callback (or by LightGBMTrainer)."""
        with checkpoint.as_directory() as directory:
            return load_booster(os.path.join(directory, filename))

    def __call__(self, env: CallbackEnv) -> None:
        last = env.iteration == env.end_iteration - 1
        evals = _evals(env.evaluation_result_list or [])
        self._core.round_done(evals, env.iteration + 1, env.model.save_model, last)

    def after_training(self, booster: lightgbm.Booster) -> lightgbm.Booster:
        """After ``lightgbm.train`` returns: save the final checkpoint if the last round did not
        (early stopping, or ``num_boost_round=0``). Call it on every rank."""
        self._core.training_done(booster.current_iteration(), best_of(booster), booster.save_model)
        return booster


RayTrainReportCallback = ReportCallback
"""Ray Train's name for :class:`ReportCallback`."""


def best_of(booster: lightgbm.Booster) -> Metrics:
    """``best_iteration`` (1-based, as LightGBM counts) and ``best_score`` after early stopping."""
    if booster.best_iteration <= 0:
        return {}
    best: Metrics = {"best_iteration": int(booster.best_iteration)}
    train_name = getattr(booster, "_train_data_name", "training")
    evals = {k: v for k, v in booster.best_score.items() if k != train_name}
    scores = flatten_metrics(evals)
    if scores:
        best["best_score"] = next(iter(scores.values()))
    return best


def _evals(results: Sequence[EvalResult]) -> dict[str, dict[str, float | None]]:
    """LightGBM's ``(data name, metric, value, higher is better[, stdv])`` list as nested dicts
    (cross-validation results give ``-mean`` and ``-stdv`` entries)."""
    evals: dict[str, dict[str, float | None]] = {}
    for entry in results:
        data_name, metric, value = entry[0], entry[1], entry[2]
        if len(entry) > 4:
            evals.setdefault(data_name, {})[f"{metric}-mean"] = value
            evals[data_name][f"{metric}-stdv"] = entry[4]
        else:
            evals.setdefault(data_name, {})[metric] = value
    return evals

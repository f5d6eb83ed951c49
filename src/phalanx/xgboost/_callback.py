"""ReportCallback: report XGBoost's eval metrics every boosting round, and save checkpoints."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import xgboost
from xgboost.callback import TrainingCallback

from phalanx._internal.gbdt.reporting import (
    MetricsArg,
    ReportSettings,
    flatten_metrics,
    send_report,
)
from phalanx.checkpoint import Checkpoint

__all__ = ["RayTrainReportCallback", "ReportCallback"]

FRAMEWORK = "xgboost"


class ReportCallback(TrainingCallback):
    """An ``xgboost.train`` callback that reports each round's eval metrics with
    ``phalanx.report`` (named ``<eval name>-<metric>``: ``train-logloss``, ``valid-auc``) and
    saves the model as a checkpoint every ``frequency`` rounds and at the end of training.

    Every rank reports every round (the metrics of XGBoost's collective are already reduced
    across workers); only rank 0 writes the model, whose copy is the same on every rank.
    ``metrics``: None (all), a name, a list of names, or ``{report_key: metric_name}`` to
    rename. ``filename``: the model file in the checkpoint (``.ubj`` or ``.json``).
    ``checkpoint_at_end``: save when training ends, unless the last round just did. After early
    stopping, the final report adds ``best_iteration`` and ``best_score``. Rounds are counted
    over resumes: with ``xgb_model=`` a model of 40 rounds, round 41 is the next.

    Example::

        def train_func():
            shard = phalanx.get_dataset_shard("train").to_pandas()
            dtrain = xgboost.DMatrix(shard.drop(columns="y"), label=shard["y"])
            xgboost.train(params, dtrain, num_boost_round=100, evals=[(dtrain, "train")],
                          callbacks=[ReportCallback(frequency=10)])

        booster = ReportCallback.get_model(result.checkpoint)
    """

    CHECKPOINT_NAME = "model.ubj"

    def __init__(
        self,
        metrics: MetricsArg = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
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
        # Set by XGBoostTrainer's loop, which knows the last round: its checkpoint is then saved
        # with that round's report instead of one more report after training.
        self._total_rounds: int | None = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> xgboost.Booster:
        """The booster saved in ``checkpoint`` by this callback (or by XGBoostTrainer)."""
        with checkpoint.as_directory() as directory:
            booster = xgboost.Booster()
            booster.load_model(os.path.join(directory, filename))
            return booster

    def before_training(self, model: Any) -> Any:
        self._last_metrics = {}
        self._last_saved_rounds = None
        return model

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        settings = self._settings
        self._last_metrics = settings.select(flatten_metrics(evals_log))
        rounds = model.num_boosted_rounds()  # epoch restarts at 0 when xgb_model is given
        last = rounds == self._total_rounds
        if settings.checkpoint_due(rounds - 1) or (last and settings.checkpoint_at_end):
            self._last_saved_rounds = rounds
            send_report(self._last_metrics, _saver(model), settings.filename, FRAMEWORK)
        else:
            send_report(self._last_metrics, None, settings.filename, FRAMEWORK)
        return False

    def after_training(self, model: Any) -> Any:
        metrics = {**self._last_metrics, **best_of(model)}
        just_saved = self._last_saved_rounds == model.num_boosted_rounds()
        if self._settings.checkpoint_at_end and not just_saved:
            send_report(metrics, _saver(model), self._settings.filename, FRAMEWORK)
        elif metrics != self._last_metrics:  # early stopping: say which round was best
            send_report(metrics, None, self._settings.filename, FRAMEWORK)
        return model


RayTrainReportCallback = ReportCallback
"""Ray Train's name for :class:`ReportCallback`."""


def best_of(model: Any) -> dict[str, Any]:
    """``best_iteration`` and ``best_score`` when early stopping recorded them."""
    iteration = model.attr("best_iteration")
    if iteration is None:
        return {}
    best: dict[str, Any] = {"best_iteration": int(iteration)}
    score = model.attr("best_score")
    if score is not None:
        best["best_score"] = float(score)
    return best


def _saver(model: Any) -> Callable[[str], None]:
    return lambda path: model.save_model(path)

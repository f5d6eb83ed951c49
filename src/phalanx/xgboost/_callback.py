"""ReportCallback: report XGBoost's eval metrics every boosting round, and save checkpoints."""

from __future__ import annotations

import os
from collections.abc import Callable

import xgboost
from xgboost.callback import TrainingCallback

from phalanx._foundation.checkpoint_files import MODEL_FILES
from phalanx._gbdt.reporting import Metrics, MetricsArg, ReportingCore, ReportSettings
from phalanx.checkpoint import Checkpoint

__all__ = ["RayTrainReportCallback", "ReportCallback"]

FRAMEWORK = "xgboost"


def load_booster(path: str) -> xgboost.Booster:
    """The booster saved in file ``path``."""
    booster = xgboost.Booster()
    booster.load_model(path)
    return booster


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

    CHECKPOINT_NAME = MODEL_FILES[FRAMEWORK][0]

    def __init__(
        self,
        metrics: MetricsArg = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[Metrics], Metrics] | None = None,
    ) -> None:
        super().__init__()
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
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> xgboost.Booster:
        """The booster saved in ``checkpoint`` by this callback (or by XGBoostTrainer)."""
        with checkpoint.as_directory() as directory:
            return load_booster(os.path.join(directory, filename))

    def before_training(self, model: xgboost.Booster) -> xgboost.Booster:
        self._core.reset()
        return model

    def after_iteration(
        self, model: xgboost.Booster, epoch: int, evals_log: TrainingCallback.EvalsLog
    ) -> bool:
        # Rounds counted over resumes: epoch restarts at 0 when xgb_model is given.
        self._core.round_done(evals_log, model.num_boosted_rounds(), model.save_model)
        return False

    def after_training(self, model: xgboost.Booster) -> xgboost.Booster:
        self._core.training_done(model.num_boosted_rounds(), best_of(model), model.save_model)
        return model


RayTrainReportCallback = ReportCallback
"""Ray Train's name for :class:`ReportCallback`."""


def best_of(model: xgboost.Booster) -> Metrics:
    """``best_iteration`` and ``best_score`` when early stopping recorded them."""
    iteration = model.attr("best_iteration")
    if iteration is None:
        return {}
    best: Metrics = {"best_iteration": int(iteration)}
    score = model.attr("best_score")
    if score is not None:
        best["best_score"] = float(score)
    return best

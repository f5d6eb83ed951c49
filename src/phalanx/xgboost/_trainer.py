"""XGBoostTrainer: distributed XGBoost on phalanx workers, in either of Ray Train's styles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import xgboost

from phalanx._gbdt.library import BuiltinLoopArgs
from phalanx._gbdt.trainer import GBDTTrainer
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.validation import ValidationConfig
from phalanx.xgboost._callback import ReportCallback
from phalanx.xgboost._config import XGBoostConfig
from phalanx.xgboost._library import XGBOOST

__all__ = ["XGBoostTrainer"]


class XGBoostTrainer(GBDTTrainer):
    """Data-parallel XGBoost: every worker boosts on its shard, and XGBoost's collective (set up
    by :class:`XGBoostConfig`) makes them build one model.

    Two ways to use it, as in Ray Train:

    * ``datasets`` + ``label_column`` + ``params`` (+ ``num_boost_round``, ``dmatrix_params``,
      and any other ``xgboost.train`` keyword such as ``early_stopping_rounds``): the training
      loop is built in. Every dataset besides ``"train"`` is an evaluation set, and every
      round's metrics (``train-logloss``, ``valid-auc``, ...) are reported.
      ``num_boost_round`` is the total: a run restarted after a failure (or resumed) continues
      boosting from the latest checkpoint's model. Checkpoints are saved every
      ``CheckpointConfig(checkpoint_frequency=...)`` rounds and at the end
      (``checkpoint_at_end``, default True). Evaluation sets are sharded like the training set
      (XGBoost reduces metrics across workers); ``dataset_config`` changes that.
    * ``train_loop_per_worker``: your function calls ``xgboost.train`` on its shard, with a
      :class:`ReportCallback` to report metrics and checkpoints.

    Before any worker starts, the label column is checked in every dataset and ``params`` are
    tried on the first rows of ``datasets["train"]``, so a typo fails at once.

    Example::

        from phalanx.xgboost import XGBoostTrainer

        trainer = XGBoostTrainer(
            datasets={"train": train_df, "valid": valid_df},
            label_column="y",
            params={"objective": "binary:logistic", "eval_metric": ["logloss", "auc"]},
            num_boost_round=100,
            scaling_config=phalanx.ScalingConfig(num_workers=2),
        )
        result = trainer.fit()
        booster = XGBoostTrainer.get_model(result.checkpoint)
    """

    _default_backend_config = XGBoostConfig
    _library = XGBOOST

    def __init__(
        self,
        train_loop_per_worker: Callable[..., object] | None = None,
        *,
        train_loop_config: dict[str, Any] | None = None,
        xgboost_config: XGBoostConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        preprocessor: object = None,
        validation_config: ValidationConfig | None = None,
        label_column: str | None = None,
        params: dict[str, Any] | None = None,
        num_boost_round: int | None = None,
        dmatrix_params: dict[str, dict[str, Any]] | None = None,
        **train_kwargs: object,
    ) -> None:
        self._init_gbdt(
            train_loop_per_worker,
            xgboost_config,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            metadata=metadata,
            preprocessor=preprocessor,
            validation_config=validation_config,
            legacy=BuiltinLoopArgs(label_column, params, num_boost_round, dmatrix_params),
            train_kwargs=train_kwargs,
        )

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> xgboost.Booster:
        """The booster saved in a checkpoint of this trainer (``result.checkpoint``)."""
        return ReportCallback.get_model(checkpoint)

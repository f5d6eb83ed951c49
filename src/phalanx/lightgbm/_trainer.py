"""LightGBMTrainer: distributed LightGBM on phalanx workers, in either of Ray Train's styles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightgbm

from phalanx._gbdt.library import BuiltinLoopArgs
from phalanx._gbdt.trainer import GBDTTrainer
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.lightgbm._callback import ReportCallback
from phalanx.lightgbm._config import LightGBMConfig
from phalanx.lightgbm._library import LIGHTGBM
from phalanx.validation import ValidationConfig

__all__ = ["LightGBMTrainer"]


class LightGBMTrainer(GBDTTrainer):
    """Data-parallel LightGBM: every worker boosts on its shard, and LightGBM's network (set up
    by :class:`LightGBMConfig`, ``tree_learner="data"``) makes them build one model.

    Two ways to use it, as in Ray Train:

    * ``datasets`` + ``label_column`` + ``params`` (+ ``num_boost_round``, ``dmatrix_params``:
      per dataset, ``lightgbm.Dataset`` arguments, and any other ``lightgbm.train`` keyword,
      plus ``early_stopping_rounds``): the training loop is built in. Every dataset besides
      ``"train"`` is an evaluation set; every round's metrics (``train-binary_logloss``,
      ``valid-auc``, ...) are reported. ``num_boost_round`` is the total: a run restarted after
      a failure (or resumed) continues boosting from the latest checkpoint's model.
      Checkpoints are saved every ``CheckpointConfig(checkpoint_frequency=...)`` rounds and at
      the end (``checkpoint_at_end``, default True). Only ``"train"`` is sharded: LightGBM
      evaluates each worker's own rows, so every worker gets whole evaluation sets, and all
      ranks see (and early-stop on) the same metrics. ``train-*`` metrics are rank 0's shard.
    * ``train_loop_per_worker``: your function calls ``lightgbm.train`` with
      ``get_network_params()`` merged into its params and a :class:`ReportCallback`.

    Before any worker starts, the label column is checked in every dataset and ``params`` are
    tried on the first rows of ``datasets["train"]``, so a typo fails at once.

    Example::

        from phalanx.lightgbm import LightGBMTrainer

        trainer = LightGBMTrainer(
            datasets={"train": train_df, "valid": valid_df},
            label_column="y",
            params={"objective": "binary", "metric": ["binary_logloss", "auc"]},
            num_boost_round=100,
            scaling_config=phalanx.ScalingConfig(num_workers=2),
        )
        booster = LightGBMTrainer.get_model(trainer.fit().checkpoint)
    """

    _default_backend_config = LightGBMConfig
    _library = LIGHTGBM

    def __init__(
        self,
        train_loop_per_worker: Callable[..., object] | None = None,
        *,
        train_loop_config: dict[str, Any] | None = None,
        lightgbm_config: LightGBMConfig | None = None,
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
            lightgbm_config,
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
    def get_model(cls, checkpoint: Checkpoint) -> lightgbm.Booster:
        """The booster saved in a checkpoint of this trainer (``result.checkpoint``)."""
        return ReportCallback.get_model(checkpoint)

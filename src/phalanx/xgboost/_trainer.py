"""XGBoostTrainer: distributed XGBoost on phalanx workers, in either of Ray Train's styles."""

from __future__ import annotations

import inspect
import logging
import re
import warnings
from collections.abc import Callable
from typing import Any

import xgboost

import phalanx
from phalanx._internal.gbdt.reporting import find_or_add_reporter
from phalanx._internal.gbdt.spec import TRAIN, GBDTSpec, read_frames, split_frame
from phalanx._internal.gbdt.trainer import GBDTTrainer, Library
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.validation import ValidationConfig
from phalanx.xgboost._callback import ReportCallback
from phalanx.xgboost._config import XGBoostConfig

__all__ = ["XGBoostTrainer"]

logger = logging.getLogger(__name__)

# DMatrix arguments that may name a column of the dataset (taken out of the features).
COLUMN_KEYS = frozenset(
    {"weight", "base_margin", "label_lower_bound", "label_upper_bound", "qid", "group"}
)
THREAD_PARAMS = ("nthread", "n_jobs")
# xgboost.train arguments the built-in loop sets itself.
OWN_ARGS = frozenset({"params", "dtrain", "num_boost_round", "evals", "xgb_model"})
PROBE_KWARGS = ("obj", "custom_metric", "maximize", "early_stopping_rounds")


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

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None = None,
        *,
        train_loop_config: dict[str, Any] | None = None,
        xgboost_config: XGBoostConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        preprocessor: Any = None,
        validation_config: ValidationConfig | None = None,
        label_column: str | None = None,
        params: dict[str, Any] | None = None,
        num_boost_round: int | None = None,
        dmatrix_params: dict[str, dict[str, Any]] | None = None,
        **train_kwargs: Any,
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
            legacy={
                "label_column": label_column,
                "params": params,
                "num_boost_round": num_boost_round,
                "dmatrix_params": dmatrix_params,
            },
            train_kwargs=train_kwargs,
        )

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> xgboost.Booster:
        """The booster saved in a checkpoint of this trainer (``result.checkpoint``)."""
        return ReportCallback.get_model(checkpoint)


# -- the built-in training loop (runs on every worker) ------------------------------------------


def train_loop(spec: GBDTSpec, config: dict[str, Any] | None = None) -> None:
    """Boost ``spec.num_boost_round`` rounds in total on this worker's shards."""
    checkpoint = phalanx.get_checkpoint()
    start = ReportCallback.get_model(checkpoint) if checkpoint is not None else None
    done = start.num_boosted_rounds() if start is not None else 0
    if start is not None and done >= spec.num_boost_round:
        # A finished run resumed: its model and metrics are the run's already; boosting zero
        # rounds would only commit one more checkpoint with empty metrics.
        logger.info("The checkpoint's model has all %d rounds; nothing to train.", done)
        return
    if start is not None:
        logger.info("Continuing from a checkpoint's model with %d rounds.", done)
    dmatrices = {name: _dmatrix(frame) for name, frame in read_frames(spec, COLUMN_KEYS).items()}
    kwargs = dict(spec.train_kwargs)
    callbacks = list(kwargs.pop("callbacks", None) or [])
    reporter = find_or_add_reporter(callbacks, ReportCallback, spec)
    reporter._total_rounds = spec.num_boost_round
    kwargs.setdefault("verbose_eval", False)
    xgboost.train(
        spec.params_with_threads(THREAD_PARAMS),
        dmatrices[TRAIN],
        num_boost_round=spec.remaining_rounds(done),
        evals=[(dmatrix, name) for name, dmatrix in dmatrices.items()],
        xgb_model=start,
        callbacks=callbacks,
        **kwargs,
    )


def _dmatrix(frame: Any) -> xgboost.DMatrix:
    return xgboost.DMatrix(frame.features, label=frame.label, **frame.kwargs)


# -- checks on the driver --------------------------------------------------------------------


def check(spec: GBDTSpec, scaling_config: ScalingConfig, dataset_config: DataConfig | None) -> None:
    """``train_kwargs`` must be ``xgboost.train`` arguments the loop does not set itself."""
    accepted = set(inspect.signature(xgboost.train).parameters) - OWN_ARGS
    own = sorted(set(spec.train_kwargs) & OWN_ARGS)
    if own:
        raise ConfigError(
            f"XGBoostTrainer got {own} as keyword arguments, which the built-in loop sets "
            "itself.\nHINT: pass params=, num_boost_round= and datasets= instead."
        )
    unknown = sorted(set(spec.train_kwargs) - accepted)
    if unknown:
        raise ConfigError(
            f"XGBoostTrainer got unknown keyword argument(s) {unknown}: extra keywords go to "
            f"xgboost.train, which accepts {sorted(accepted)}.\nHINT: booster parameters "
            "(max_depth, eta, ...) go in params=."
        )


def probe(spec: GBDTSpec, head: Any) -> None:
    """Train one round on ``head`` (the first rows of the training data) with ``spec.params``:
    XGBoost's own error, now, rather than from every worker later."""
    frame = split_frame(head, spec.label_column, spec.dmatrix_params.get(TRAIN, {}), COLUMN_KEYS)
    kwargs = {k: v for k, v in spec.train_kwargs.items() if k in PROBE_KWARGS}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dtrain = _dmatrix(frame)
            xgboost.train(
                {**spec.params, "nthread": 1},
                dtrain,
                num_boost_round=1,
                evals=[(dtrain, TRAIN)],
                verbose_eval=False,
                **kwargs,
            )
    except (xgboost.core.XGBoostError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"XGBoost rejected the training setup (params={spec.params!r}, tried on the first "
            f"{frame.num_rows} rows of datasets['train']):\n{_clean(exc)}\nHINT: fix params "
            "(or dmatrix_params, or the data's column types: XGBoost takes numbers, booleans "
            "and, with dmatrix_params={'train': {'enable_categorical': True}}, categories)."
        ) from exc
    for warning in caught:
        text = str(warning.message)
        if "are not used" in text:
            logger.warning(
                "XGBoost ignores some params: %s HINT: check their spelling.", _clean(text)
            )


def _clean(error: Any) -> str:
    """XGBoost's message without its ``[time] file:line:`` prefixes, at most 12 lines."""
    text = re.sub(r"\[\d\d:\d\d:\d\d\] (WARNING: )?\S+:\d+: ", "", str(error)).strip()
    lines = text.splitlines()
    return "\n".join(lines[:12] + (["..."] if len(lines) > 12 else []))


XGBoostTrainer._library = Library(
    trainer="XGBoostTrainer",
    name="XGBoost",
    config_arg="xgboost_config",
    config_type=XGBoostConfig,
    column_keys=COLUMN_KEYS,
    split_eval_sets=True,
    train_loop=train_loop,
    check=check,
    probe=probe,
)

"""LightGBMTrainer: distributed LightGBM on phalanx workers, in either of Ray Train's styles."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import lightgbm

import phalanx
from phalanx._internal.gbdt.reporting import find_or_add_reporter
from phalanx._internal.gbdt.spec import TRAIN, Frame, GBDTSpec, read_frames, split_frame
from phalanx._internal.gbdt.trainer import GBDTTrainer, Library
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.lightgbm._callback import ReportCallback
from phalanx.lightgbm._config import LightGBMConfig
from phalanx.lightgbm._network import get_network_params
from phalanx.validation import ValidationConfig

__all__ = ["LightGBMTrainer"]

logger = logging.getLogger(__name__)

# lightgbm.Dataset arguments that may name a column of the dataset (taken out of the features).
COLUMN_KEYS = frozenset({"weight", "group", "init_score", "position"})
THREAD_PARAMS = ("num_threads", "num_thread", "nthread", "nthreads", "n_jobs")
VERBOSITY_PARAMS = ("verbosity", "verbose")
# Parameters (and aliases) the backend sets: the user's would point LightGBM elsewhere.
NETWORK_PARAMS = frozenset(
    {
        "num_machines", "num_machine", "machines", "workers", "nodes", "local_listen_port",
        "local_port", "port", "machine_list_filename", "machine_list_file", "machine_list",
        "mlist",
    }
)  # fmt: skip
TREE_LEARNER_PARAMS = ("tree_learner", "tree", "tree_type", "tree_learner_type")
EARLY_STOPPING_PARAMS = (
    "early_stopping_round",
    "early_stopping_rounds",
    "early_stopping",
    "n_iter_no_change",
)
OWN_ARGS = frozenset(
    {"params", "train_set", "num_boost_round", "valid_sets", "valid_names", "init_model"}
)


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

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None = None,
        *,
        train_loop_config: dict[str, Any] | None = None,
        lightgbm_config: LightGBMConfig | None = None,
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
            legacy={
                "label_column": label_column,
                "params": params,
                "num_boost_round": num_boost_round,
                "dmatrix_params": dmatrix_params,
            },
            train_kwargs=train_kwargs,
        )

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> lightgbm.Booster:
        """The booster saved in a checkpoint of this trainer (``result.checkpoint``)."""
        return ReportCallback.get_model(checkpoint)


# -- the built-in training loop (runs on every worker) ------------------------------------------


def train_loop(spec: GBDTSpec, config: dict[str, Any] | None = None) -> None:
    """Boost ``spec.num_boost_round`` rounds in total on this worker's shards."""
    checkpoint = phalanx.get_checkpoint()
    start = ReportCallback.get_model(checkpoint) if checkpoint is not None else None
    done = start.current_iteration() if start is not None else 0
    if start is not None and done >= spec.num_boost_round:
        # A finished run resumed: its model and metrics are the run's already; boosting zero
        # rounds would only commit one more checkpoint with empty metrics.
        logger.info("The checkpoint's model has all %d rounds; nothing to train.", done)
        return
    if start is not None:
        logger.info("Continuing from a checkpoint's model with %d rounds.", done)
    frames = read_frames(spec, COLUMN_KEYS)
    train_set = _dataset(frames[TRAIN])
    valid_sets = [train_set] + [_dataset(f, train_set) for n, f in frames.items() if n != TRAIN]
    kwargs = dict(spec.train_kwargs)
    params = _params(spec, kwargs.pop("early_stopping_rounds", None))
    callbacks = list(kwargs.pop("callbacks", None) or [])
    reporter = find_or_add_reporter(callbacks, ReportCallback, spec)
    params.update(get_network_params())  # last: frees the reserved port for LightGBM
    booster = lightgbm.train(
        params,
        train_set,
        num_boost_round=spec.remaining_rounds(done),
        valid_sets=valid_sets,
        valid_names=list(frames),
        init_model=start,
        callbacks=callbacks,
        **kwargs,
    )
    reporter.after_training(booster)


def _params(spec: GBDTSpec, early_stopping_rounds: Any) -> dict[str, Any]:
    params = spec.params_with_threads(THREAD_PARAMS)
    if not any(p in params for p in VERBOSITY_PARAMS):
        params["verbosity"] = 0  # warnings, not LightGBM's per-run info lines on every rank
    if early_stopping_rounds is not None:
        params["early_stopping_round"] = early_stopping_rounds
    if phalanx.get_context().get_world_size() > 1 and not any(
        p in params for p in TREE_LEARNER_PARAMS
    ):
        params["tree_learner"] = "data"
    return params


def _dataset(frame: Frame, reference: lightgbm.Dataset | None = None) -> lightgbm.Dataset:
    return lightgbm.Dataset(frame.features, label=frame.label, reference=reference, **frame.kwargs)


# -- checks on the driver --------------------------------------------------------------------


def check(spec: GBDTSpec, scaling_config: ScalingConfig, dataset_config: DataConfig | None) -> None:
    """Arguments LightGBM would reject or that would make the workers disagree."""
    _check_kwargs(spec)
    params = spec.params
    network = sorted(NETWORK_PARAMS & set(params))
    if network:
        raise ConfigError(
            f"LightGBMTrainer params set {network}, which phalanx sets itself (a free port "
            "per worker).\nHINT: remove them; use LightGBMConfig(time_out=...) for the time-out."
        )
    distributed = scaling_config.num_workers > 1
    learner = next((params[p] for p in TREE_LEARNER_PARAMS if p in params), None)
    if distributed and learner in ("serial",):
        raise ConfigError(
            f"LightGBMTrainer params set tree_learner={learner!r} with "
            f"num_workers={scaling_config.num_workers}: each worker would train its own model "
            "on its shard.\nHINT: use 'data' (the default here), 'feature' or 'voting', or "
            "num_workers=1."
        )
    stops = "early_stopping_rounds" in spec.train_kwargs or any(
        p in params for p in EARLY_STOPPING_PARAMS
    )
    if stops and len(spec.dataset_names) < 2:
        raise ConfigError(
            "LightGBMTrainer: early stopping needs an evaluation set, but datasets has only "
            "'train'.\nHINT: add one, e.g. datasets={'train': ..., 'valid': ...}."
        )
    split = dataset_config.datasets_to_split if dataset_config is not None else [TRAIN]
    sharded = [n for n in spec.dataset_names[1:] if split == "all" or n in split]
    if distributed and stops and sharded:
        raise ConfigError(
            f"LightGBMTrainer: dataset_config shards the evaluation set(s) {sharded} while "
            "early stopping is on. LightGBM evaluates each worker's own rows, so workers would "
            "decide to stop at different rounds and wait for each other forever.\nHINT: leave "
            "dataset_config out (evaluation sets then go whole to every worker)."
        )


def _check_kwargs(spec: GBDTSpec) -> None:
    accepted = (set(inspect.signature(lightgbm.train).parameters) - OWN_ARGS) | {
        "early_stopping_rounds"
    }
    own = sorted(set(spec.train_kwargs) & OWN_ARGS)
    if own:
        raise ConfigError(
            f"LightGBMTrainer got {own} as keyword arguments, which the built-in loop sets "
            "itself.\nHINT: pass params=, num_boost_round= and datasets= instead."
        )
    unknown = sorted(set(spec.train_kwargs) - accepted)
    if unknown:
        raise ConfigError(
            f"LightGBMTrainer got unknown keyword argument(s) {unknown}: extra keywords go to "
            f"lightgbm.train, which accepts {sorted(accepted)}.\nHINT: booster parameters "
            "(num_leaves, learning_rate, ...) go in params=."
        )


def probe(spec: GBDTSpec, head: Any) -> None:
    """Train one round on ``head`` (the first rows of the training data) with ``spec.params``:
    LightGBM's own error, now, rather than from every worker later."""
    frame = split_frame(head, spec.label_column, spec.dmatrix_params.get(TRAIN, {}), COLUMN_KEYS)
    params = {
        **{k: v for k, v in spec.params.items() if k not in TREE_LEARNER_PARAMS},
        "num_threads": 1,
        "verbosity": -1,
    }
    if "early_stopping_rounds" in spec.train_kwargs:
        params["early_stopping_round"] = spec.train_kwargs["early_stopping_rounds"]
    try:
        train_set = _dataset(frame)
        valid = _dataset(frame, train_set)
        lightgbm.train(params, train_set, num_boost_round=1, valid_sets=[valid])
    except (lightgbm.basic.LightGBMError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"LightGBM rejected the training setup (params={spec.params!r}, tried on the first "
            f"{frame.num_rows} rows of datasets['train']):\n{exc}\nHINT: fix params (or "
            "dmatrix_params, or the data's column types: LightGBM takes numbers, booleans and "
            "pandas categories)."
        ) from exc


LightGBMTrainer._library = Library(
    trainer="LightGBMTrainer",
    name="LightGBM",
    config_arg="lightgbm_config",
    config_type=LightGBMConfig,
    column_keys=COLUMN_KEYS,
    split_eval_sets=False,
    train_loop=train_loop,
    check=check,
    probe=probe,
)

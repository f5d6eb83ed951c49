"""Checks made when a GBDT trainer is constructed, before any worker starts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from phalanx._gbdt.library import BuiltinLoopArgs, Params
from phalanx._gbdt.spec import TRAIN
from phalanx.config import RunConfig, ScalingConfig
from phalanx.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = [
    "check_engine",
    "check_legacy_args",
    "check_score_attribute",
    "check_style",
    "checkpoint_settings",
    "head_frame",
]

PROBE_ROWS = 256


def check_style(
    trainer: str,
    train_loop_per_worker: Callable[..., object] | None,
    legacy: BuiltinLoopArgs,
    train_kwargs: Params,
) -> None:
    """A trainer runs either the user's loop or the built-in one, never a mix of both."""
    if train_loop_per_worker is None:
        return
    given = sorted(legacy.given() + list(train_kwargs))
    if given:
        raise ConfigError(
            f"{trainer} got train_loop_per_worker and also {given}, which only the built-in "
            "training loop uses.\nHINT: either pass train_loop_per_worker (and call the library "
            "yourself in it), or leave it out and pass datasets=, label_column=, params=, "
            "num_boost_round=."
        )


def check_legacy_args(
    trainer: str,
    datasets: dict[str, object],
    label_column: object,
    params: object,
    num_boost_round: object,
    dmatrix_params: object,
    column_keys: frozenset[str],
) -> tuple[str, ...]:
    """Check the built-in loop's arguments; return the dataset names, ``"train"`` first."""
    if TRAIN not in datasets:
        raise ConfigError(
            f"{trainer} without train_loop_per_worker needs datasets={{'train': ...}} "
            f"(given: {sorted(datasets) or 'no datasets'}).\nHINT: name the training data "
            "'train'; every other dataset becomes an evaluation set."
        )
    if not isinstance(label_column, str) or not label_column:
        raise ConfigError(
            f"{trainer}(label_column={label_column!r}) is invalid: it must name the label "
            "column of the datasets."
        )
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"{trainer}(params={params!r}) is invalid: it must be a dict.")
    if isinstance(num_boost_round, bool) or not isinstance(num_boost_round, int):
        raise ConfigError(
            f"{trainer}(num_boost_round={num_boost_round!r}) is invalid: it must be an integer "
            ">= 1."
        )
    if num_boost_round < 1:
        raise ConfigError(
            f"{trainer}(num_boost_round={num_boost_round}) is invalid: it must be >= 1."
        )
    per_dataset = _check_dmatrix_params(trainer, datasets, dmatrix_params)
    from phalanx.data._ingest import require_columns

    for name, value in datasets.items():
        kwargs = per_dataset.get(name, {})
        named = [v for k, v in kwargs.items() if k in column_keys and isinstance(v, str)]
        what = f"{trainer}(label_column={label_column!r})"
        if named:
            what += f" with dmatrix_params[{name!r}]={kwargs!r}"
        require_columns(value, [label_column, *named], what, name)
    return (TRAIN, *[name for name in datasets if name != TRAIN])


def check_score_attribute(trainer: str, run_config: RunConfig, names: tuple[str, ...]) -> None:
    """``CheckpointConfig(checkpoint_score_attribute="valid-auc")`` must name a dataset."""
    attr = run_config.checkpoint_config.checkpoint_score_attribute
    if attr is None or "-" not in attr:
        return
    dataset = attr.split("-", 1)[0]
    if dataset not in names and not any(attr.startswith(f"{n}-") for n in names):
        raise ConfigError(
            f"CheckpointConfig(checkpoint_score_attribute={attr!r}) refers to a dataset "
            f"{dataset!r}, but {trainer} evaluates {list(names)}.\nHINT: metrics are named "
            "<dataset name>-<metric name>, e.g. 'valid-logloss'."
        )


def check_engine(trainer: str, library: str, scaling_config: ScalingConfig) -> None:
    if scaling_config.engine == "thread" and scaling_config.max_workers > 1:
        raise ConfigError(
            f"ScalingConfig(engine='thread', num_workers={scaling_config.num_workers}) cannot "
            f"run {trainer}: {library}'s distributed state is one per process.\nHINT: leave "
            "engine=None (local worker processes), or use num_workers=1."
        )


def checkpoint_settings(run_config: RunConfig) -> tuple[int, bool]:
    """``(checkpoint_frequency, checkpoint_at_end)``; at-end defaults to True, as in Ray."""
    config = run_config.checkpoint_config
    at_end = True if config.checkpoint_at_end is None else bool(config.checkpoint_at_end)
    return int(config.checkpoint_frequency), at_end


def head_frame(value: object, rows: int = PROBE_ROWS) -> pd.DataFrame | None:
    """The first ``rows`` rows of a dataset value as a pandas DataFrame, read cheaply; None for
    data only known later (a function returning the data, a Ray dataset)."""
    import pandas as pd
    import pyarrow as pa

    from phalanx.data import DataIterator, Dataset, as_dataset

    if isinstance(value, pd.DataFrame):
        return value.head(rows)
    if isinstance(value, pa.Table):
        return value.slice(0, rows).to_pandas()
    if isinstance(value, dict):
        return pd.DataFrame({k: _first(v, rows) for k, v in value.items()})
    if isinstance(value, list) and all(isinstance(r, dict) for r in value[:rows]):
        return pd.DataFrame(value[:rows])
    if callable(value) and not isinstance(value, Dataset | DataIterator):
        return None
    if type(value).__module__.startswith("ray."):
        return None
    batches = iter(
        as_dataset(value)
        .iterator()
        .iter_batches(batch_size=rows, batch_format="pandas", prefetch_batches=0)
    )
    try:
        return next(batches, None)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _first(column: Sequence[object], rows: int) -> np.ndarray:
    import numpy as np

    return np.asarray(column[:rows])


def _check_dmatrix_params(
    trainer: str, datasets: dict[str, object], dmatrix_params: object
) -> dict[str, dict[str, object]]:
    """``dmatrix_params`` checked: per dataset name, the data object's keyword arguments."""
    if dmatrix_params is None:
        return {}
    if not isinstance(dmatrix_params, dict) or not all(
        isinstance(v, dict) for v in dmatrix_params.values()
    ):
        raise ConfigError(
            f"{trainer}(dmatrix_params={dmatrix_params!r}) is invalid: it must map dataset "
            "names to dicts of keyword arguments, e.g. {'train': {'weight': 'w'}}."
        )
    unknown = sorted(set(dmatrix_params) - set(datasets))
    if unknown:
        raise ConfigError(
            f"{trainer}(dmatrix_params=...) refers to dataset(s) {unknown}, which are not in "
            f"datasets (given: {sorted(datasets)}).\nHINT: use the keys of datasets=."
        )
    return dmatrix_params

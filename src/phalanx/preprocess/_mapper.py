"""BatchMapper: a user function applied to batches (AIR's ``ray.data.preprocessors.BatchMapper``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from phalanx.errors import ConfigError
from phalanx.preprocess._base import (
    DEFAULT_FIT_BATCH_SIZE,
    Preprocessor,
    _numpy_to_pandas,
    pandas_to_numpy,
)

if TYPE_CHECKING:
    from phalanx.data import Dataset


__all__ = ["BatchMapper"]

BATCH_FORMATS = ("pandas", "numpy")
TENSOR_COLUMN = "__value__"  # what a bare array returned by ``fn`` becomes


class BatchMapper(Preprocessor):
    """Applies ``fn`` to each batch: a pandas DataFrame (``batch_format="pandas"``, the default)
    or a dict of numpy arrays (``"numpy"``); it needs no fitting. ``transform_batch`` gives back
    the kind of batch it got; ``fn`` is cloudpickled (lambdas and closures are fine) and checked
    for that here, so a checkpoint can always hold it.

    Example::

        add_one = BatchMapper(lambda df: df.assign(x=df["x"] + 1), batch_format="pandas")
        add_one.transform_batch(pd.DataFrame({"x": [1, 2]}))["x"].tolist()  # [2, 3]
    """

    _is_fittable = False

    def __init__(
        self,
        fn: Callable[[Any], object],  # takes the user's batch_format
        batch_format: str | None = None,
        batch_size: int | str | None = "default",
    ) -> None:
        super().__init__()
        if not callable(fn):
            raise ConfigError(f"BatchMapper(fn={fn!r}) is invalid: fn must be a function.")
        if batch_format is not None and batch_format not in BATCH_FORMATS:
            raise ConfigError(
                f"BatchMapper(batch_format={batch_format!r}) is invalid: use 'pandas' or 'numpy'."
            )
        if not (
            batch_size in ("default", None) or (isinstance(batch_size, int) and batch_size > 0)
        ):
            raise ConfigError(
                f"BatchMapper(batch_size={batch_size!r}) is invalid: use a positive int, "
                "'default' (4096) or None (whole blocks)."
            )
        _check_picklable(fn)
        self.fn = fn
        self.batch_format = batch_format or "pandas"
        self.batch_size = batch_size

    def transform(self, ds: object, *, batch_size: int | None = None) -> Dataset:
        size = batch_size or self.batch_size
        if not isinstance(size, int):  # "default", or None (whole blocks): Ray's 4096 here
            size = DEFAULT_FIT_BATCH_SIZE
        return super().transform(ds, batch_size=size)

    def preferred_batch_format(self) -> str:
        return self.batch_format

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        if self.batch_format == "pandas":
            return _as_pandas(self.fn(df))
        return _as_pandas(self.fn(pandas_to_numpy(df)))

    def _transform_numpy(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.batch_format == "numpy":
            return _as_numpy(self.fn(dict(batch)))
        return _as_numpy(self.fn(_numpy_to_pandas(batch)))

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return f"BatchMapper(fn={name}, batch_format={self.batch_format!r})"


def _as_pandas(out: object) -> pd.DataFrame:
    if isinstance(out, pd.DataFrame):
        return out
    return _numpy_to_pandas(_as_numpy(out))


def _as_numpy(out: object) -> dict[str, np.ndarray]:
    if isinstance(out, pd.DataFrame):
        return pandas_to_numpy(out)
    if isinstance(out, np.ndarray):
        return {TENSOR_COLUMN: out}
    if isinstance(out, dict):
        return {str(k): np.asarray(v) for k, v in out.items()}
    raise TypeError(
        f"BatchMapper's fn returned a {type(out).__name__}; it must return a pandas DataFrame, "
        "a dict of numpy arrays or a numpy array."
    )


def _check_picklable(fn: Callable[..., object]) -> None:
    import cloudpickle

    try:
        cloudpickle.dumps(fn)
    except Exception as exc:
        raise ConfigError(
            f"BatchMapper(fn={getattr(fn, '__name__', fn)!r}) cannot be pickled ({type(exc).__name__}: "
            f"{exc}), so it could not be saved in checkpoints or sent to workers.\nHINT: do not "
            "capture open files, locks, sockets or live models in fn; create them inside it."
        ) from exc

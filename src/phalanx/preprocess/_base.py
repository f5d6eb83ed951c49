"""The ``Preprocessor`` base: fit statistics by streaming over batches, transform batch by batch.

A subclass implements ``_fit(batches)`` (``batches()`` starts a fresh pass of pandas batches;
memory stays bounded by one batch plus the statistics) and ``_transform_pandas(df)``.
``transform_batch`` takes a pandas DataFrame, a dict of numpy arrays or a pyarrow Table and
returns the same kind.
"""

from __future__ import annotations

import enum
import pickle
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

if TYPE_CHECKING:
    from phalanx.data import Dataset

__all__ = ["FitStatus", "Preprocessor", "PreprocessorNotFittedError"]

DEFAULT_FIT_BATCH_SIZE = 4096

Batches = Callable[[], Iterator[pd.DataFrame]]


class PreprocessorNotFittedError(RuntimeError):
    """A fittable preprocessor was used to transform data before ``fit``."""


class FitStatus(str, enum.Enum):  # enum.StrEnum from Python 3.11 on; Ray's is (str, Enum) too
    """Whether a preprocessor has been fitted (``Preprocessor.fit_status()``), as Ray's.

    Example::

        scaler = StandardScaler(columns=["x"])
        assert scaler.fit_status() == FitStatus.NOT_FITTED
    """

    NOT_FITTABLE = "NOT_FITTABLE"
    NOT_FITTED = "NOT_FITTED"
    PARTIALLY_FITTED = "PARTIALLY_FITTED"
    FITTED = "FITTED"

    # Print as the value, as enum.StrEnum (3.11+) does: "FITTED", not "FitStatus.FITTED".
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # typeshed types Enum's differently


class Preprocessor:
    """Base of every preprocessor (Ray's ``ray.data.preprocessor.Preprocessor``).

    Example::

        scaler = StandardScaler(columns=["x"]).fit(phalanx.data.from_pandas(df))
        scaled = scaler.transform_batch(df)
    """

    _is_fittable = True

    def __init__(self) -> None:
        # Each preprocessor's statistics by Ray's names ("mean(x)"): numbers, value lists, ...
        self.stats_: dict[str, Any] = {}
        self._fitted = False

    # -- public API --------------------------------------------------------------------------

    def fit_status(self) -> FitStatus:
        if not self._is_fittable:
            return FitStatus.NOT_FITTABLE
        return FitStatus.FITTED if self._fitted else FitStatus.NOT_FITTED

    def fit(self, ds: object, *, batch_size: int = DEFAULT_FIT_BATCH_SIZE) -> Preprocessor:
        """Compute the statistics over ``ds`` (anything ``datasets=`` accepts), one batch at a
        time; refitting replaces them. A no-op for preprocessors that need no statistics."""
        if not self._is_fittable:
            return self
        from phalanx.data import as_dataset

        dataset = as_dataset(ds, "preprocessor input")
        self._check_columns(dataset.columns(), "fit")

        def batches() -> Iterator[pd.DataFrame]:
            frames: Iterator[pd.DataFrame] = dataset.iter_batches(
                batch_size=batch_size, batch_format="pandas"
            )
            return frames

        self._fit_batches(batches)
        return self

    def fit_transform(self, ds: object, **kwargs: int) -> Dataset:
        self.fit(ds, **kwargs)
        return self.transform(ds)

    def transform(self, ds: object, *, batch_size: int = DEFAULT_FIT_BATCH_SIZE) -> Dataset:
        """``ds`` transformed, as a :class:`phalanx.data.Dataset` held in memory. To transform
        data larger than memory, apply :meth:`transform_batch` to each batch as it is read."""
        self._check_fitted()
        from phalanx.data import as_dataset, from_arrow
        from phalanx.data._transform import pandas_to_arrow

        dataset = as_dataset(ds, "preprocessor input")
        self._check_columns(dataset.columns(), "transform")
        tables = [
            pandas_to_arrow(self._transform_pandas(batch))
            for batch in dataset.iter_batches(batch_size=batch_size, batch_format="pandas")
        ]
        if not tables:
            return from_arrow(pa.table({}))
        return from_arrow(pa.concat_tables(tables))

    def transform_batch(self, data: Any) -> Any:  # returns the kind of batch it is given
        """One batch transformed: a pandas DataFrame, dict of numpy arrays or pyarrow Table in,
        the same kind out."""
        self._check_fitted()
        batch = data
        if isinstance(batch, pd.DataFrame):
            self._check_columns([str(c) for c in batch.columns], "transform_batch")
            return self._transform_pandas(batch)
        if isinstance(batch, dict):
            self._check_columns(list(batch), "transform_batch")
            return self._transform_numpy(batch)
        if isinstance(batch, pa.Table):
            self._check_columns(batch.column_names, "transform_batch")
            from phalanx.data._transform import pandas_to_arrow

            return pandas_to_arrow(self._transform_pandas(batch.to_pandas()))
        raise TypeError(
            f"transform_batch got a {type(batch).__name__}; it takes a pandas DataFrame, a dict "
            "of numpy arrays or a pyarrow Table."
        )

    def preferred_batch_format(self) -> str:
        return "pandas"

    def serialize(self) -> bytes:
        """The preprocessor as bytes (cloudpickle: functions and lambdas in it are kept)."""
        import cloudpickle

        data: bytes = cloudpickle.dumps(self)
        return data

    @staticmethod
    def deserialize(data: bytes) -> Preprocessor:
        obj = pickle.loads(data)
        if not isinstance(obj, Preprocessor):
            raise TypeError(f"the bytes hold a {type(obj).__name__}, not a Preprocessor.")
        return obj

    # -- for subclasses ----------------------------------------------------------------------

    def _fit_batches(self, batches: Batches) -> None:
        self.stats_ = {}
        self._fit(batches)
        self._fitted = True

    def _fit(self, batches: Batches) -> None:
        raise NotImplementedError

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        raise NotImplementedError

    def _transform_numpy(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self._transform_pandas(_numpy_to_pandas(batch))
        return pandas_to_numpy(out)

    def _input_columns(self) -> list[str]:
        """Columns the input must have."""
        return list(getattr(self, "columns", []))

    def _check_fitted(self) -> None:
        if self.fit_status() == FitStatus.NOT_FITTED:
            raise PreprocessorNotFittedError(
                f"{self!r} is not fitted, so it has no statistics to transform with.\n"
                "HINT: call .fit(dataset) first (or pass it to a trainer's preprocessor=)."
            )

    def _check_columns(self, have: list[str], where: str) -> None:
        missing = [c for c in self._input_columns() if c not in have]
        if missing:
            raise ValueError(
                f"{type(self).__name__}.{where}: the data lacks column(s) {missing} "
                f"(it has {have}).\nHINT: check the column names given to the preprocessor."
            )

    def __repr__(self) -> str:
        cols = getattr(self, "columns", None)
        return f"{type(self).__name__}(columns={cols!r})"


def output_names(columns: list[str], output_columns: list[str] | None) -> list[str]:
    if output_columns is None:
        return list(columns)
    if len(output_columns) != len(columns):
        raise ValueError(
            f"output_columns has {len(output_columns)} name(s) but columns has "
            f"{len(columns)}: give one output name per input column."
        )
    return list(output_columns)


def _numpy_to_pandas(batch: dict[str, np.ndarray]) -> pd.DataFrame:
    data = {k: (list(v) if np.ndim(v) > 1 else v) for k, v in batch.items()}
    return pd.DataFrame(data)


def pandas_to_numpy(df: pd.DataFrame) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in df.columns:
        values = df[name].to_numpy()
        if values.dtype == object and len(values) and isinstance(values[0], np.ndarray):
            values = np.stack(list(values))
        out[str(name)] = values
    return out

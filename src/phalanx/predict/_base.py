"""The ``Predictor`` base: a model loaded from a checkpoint, applied to batches.

``predict(data)`` takes a pandas DataFrame, a numpy array, a dict of numpy arrays or a pyarrow
Table and returns what AIR's did (DataFrame -> DataFrame, array or dict -> dict of arrays, Table
-> Table): the checkpoint's preprocessor is applied to the raw input, the feature columns are
picked, the model runs (``_predict_numpy`` or ``_predict_pandas``), and ``keep_columns`` are
carried over next to the predictions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeAlias, cast

import numpy as np
import pandas as pd
import pyarrow as pa

from phalanx._foundation.checkpoint_files import framework_of, load_preprocessor
from phalanx.checkpoint import Checkpoint

# What a model is given: a DataFrame, a matrix or a dict of arrays (pyarrow input is converted).
Batch: TypeAlias = "pd.DataFrame | np.ndarray | dict[str, np.ndarray]"
# What predict takes: a batch, or a pyarrow Table.
Input: TypeAlias = "Batch | pa.Table"
# Predictions by output column (and kept columns), one value per row.
Columns: TypeAlias = "dict[str, np.ndarray]"


class BatchPreprocessor(Protocol):
    """What a predictor applies to each batch: phalanx's or Ray's Preprocessor."""

    def transform_batch(self, data: Batch) -> Input: ...


__all__ = [
    "PandasUDFPredictor",
    "Predictor",
    "PredictorNotSerializableError",
    "checkpoint_framework",
]


class PredictorNotSerializableError(RuntimeError):
    """A Predictor was pickled; it holds a live model. Pickle its checkpoint instead."""


def checkpoint_framework(checkpoint: Checkpoint) -> str | None:
    """``"torch"``, ``"xgboost"``, ``"lightgbm"`` (from the metadata's ``framework`` or the
    model file it holds), or None if unknown.

    Example::

        if checkpoint_framework(result.checkpoint) == "xgboost":
            predictor = XGBoostPredictor.from_checkpoint(result.checkpoint)
    """
    return framework_of(checkpoint)


class Predictor:
    """Loads a trained model and predicts on batches (Ray AIR's ``ray.train.predictor``).

    ``predict(data)`` takes what AIR's did and returns the same kind: a pandas DataFrame gives
    a DataFrame; a numpy array or a dict of arrays gives a dict of arrays; a ``pyarrow.Table``
    gives a Table. A subclass implements ``_predict_pandas`` and/or ``_predict_numpy`` (the one
    matching the input is used when both are).

    Example::

        predictor = TorchPredictor.from_checkpoint(result.checkpoint, model=MyModel())
        predictions = predictor.predict(df, feature_columns=["x"])  # DataFrame in, out
    """

    #: the batch format BatchPredictor reads for this predictor
    batch_format = "pandas"

    def __init__(self, preprocessor: BatchPreprocessor | None = None) -> None:
        self._preprocessor = preprocessor

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, **kwargs: Any) -> Predictor:
        raise NotImplementedError

    @classmethod
    def from_pandas_udf(cls, pandas_udf: Callable[..., pd.DataFrame]) -> Predictor:
        """A predictor that calls ``pandas_udf(df, **predict_kwargs)`` on each batch."""
        return PandasUDFPredictor(pandas_udf)

    @classmethod
    def preferred_batch_format(cls) -> str:
        return cls.batch_format

    def get_preprocessor(self) -> BatchPreprocessor | None:
        return self._preprocessor

    def set_preprocessor(self, preprocessor: BatchPreprocessor | None) -> None:
        self._preprocessor = preprocessor

    def predict(
        self,
        data: Any,  # an Input; the result is of the same kind (DataFrame, Columns or Table)
        *,
        feature_columns: list[str] | list[int] | None = None,
        keep_columns: list[str] | None = None,
        **kwargs: Any,  # the user's, for the model
    ) -> Any:
        """Predictions for ``data``, returned as the same kind (see the class docstring):
        a ``predictions`` column (or one column per model output) plus ``keep_columns``
        (taken from the preprocessed batch, as AIR's BatchPredictor did, or else from the raw
        input). ``feature_columns``: the columns the model gets (indices for a numpy array)."""
        kind = _input_kind(data)
        batch = _as_batch(data, kind, self._numpy_native())
        if self._preprocessor is not None:
            batch = _unwrap(self._preprocessor.transform_batch(batch))
        if keep_columns and kind == "array":
            raise ValueError(
                f"keep_columns={keep_columns} cannot be used with a numpy array input: it has "
                "no column names.\nHINT: pass a dict of arrays or a DataFrame instead."
            )
        kept = _kept(keep_columns or [], batch, data, kind)
        if feature_columns is not None:
            batch = _select(batch, list(feature_columns))
        out = self._run(batch, **kwargs)
        out.update(kept)
        if kind == "pandas":
            return _to_pandas(out)
        if kind == "arrow":
            return to_arrow(out)
        return out

    def _numpy_native(self) -> bool:
        return type(self)._predict_numpy is not Predictor._predict_numpy

    def _pandas_native(self) -> bool:
        return type(self)._predict_pandas is not Predictor._predict_pandas

    def _run(self, batch: Batch, **kwargs: Any) -> Columns:
        if (isinstance(batch, pd.DataFrame) and self._pandas_native()) or not self._numpy_native():
            frame = batch if isinstance(batch, pd.DataFrame) else _numpy_to_frame(batch)
            result = self._predict_pandas(frame, **kwargs)
            return {str(c): _column(result[c]) for c in result.columns}
        arrays = _pandas_to_numpy(batch) if isinstance(batch, pd.DataFrame) else batch
        output = self._predict_numpy(arrays, **kwargs)
        return dict(output) if isinstance(output, dict) else {"predictions": np.asarray(output)}

    def _predict_numpy(
        self, data: np.ndarray | dict[str, np.ndarray], **kwargs: Any
    ) -> np.ndarray | dict[str, np.ndarray]:
        raise NotImplementedError

    def _predict_pandas(self, data: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
        raise NotImplementedError

    def __reduce__(self) -> tuple[object, ...]:
        raise PredictorNotSerializableError(
            f"{type(self).__name__} is not serializable: it holds a loaded model.\n"
            "HINT: pass the checkpoint and the predictor class instead (BatchPredictor does), "
            "and build the predictor with from_checkpoint where it runs."
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(preprocessor={self._preprocessor!r})"


class PandasUDFPredictor(Predictor):
    """What ``Predictor.from_pandas_udf`` returns: a function of a DataFrame as a predictor."""

    def __init__(
        self, pandas_udf: Callable[..., pd.DataFrame], preprocessor: BatchPreprocessor | None = None
    ):
        super().__init__(preprocessor)
        self.pandas_udf = pandas_udf

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Checkpoint | None = None, **kwargs: Any
    ) -> PandasUDFPredictor:
        return cls(kwargs["pandas_udf"], preprocessor=load_preprocessor(checkpoint))

    def _predict_pandas(self, data: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
        return self.pandas_udf(data, **kwargs)


TENSOR_COLUMN = "__value__"  # Ray's name for the one column a bare numpy array becomes


def _input_kind(data: object) -> str:
    if isinstance(data, pd.DataFrame):
        return "pandas"
    if isinstance(data, np.ndarray):
        return "array"
    if isinstance(data, dict):
        return "numpy"
    if isinstance(data, pa.Table):
        return "arrow"
    raise TypeError(
        f"predict got a {type(data).__name__}; it takes a pandas DataFrame, a numpy array, a "
        "dict of numpy arrays or a pyarrow Table."
    )


def _as_batch(data: Input, kind: str, numpy_native: bool) -> Batch:
    if isinstance(data, pa.Table):
        from phalanx.data._batching import arrow_to_numpy

        return arrow_to_numpy(data, writable=True) if numpy_native else data.to_pandas()
    return data


def _unwrap(batch: object) -> Batch:
    """A preprocessor's output: a pyarrow Table becomes pandas; a lone tensor column an array."""
    if isinstance(batch, pa.Table):
        batch = batch.to_pandas()
    if isinstance(batch, dict) and list(batch) == [TENSOR_COLUMN]:
        return cast(np.ndarray, batch[TENSOR_COLUMN])
    return cast(Batch, batch)  # a preprocessor returns the kind of batch it was given


def _kept(columns: list[str], batch: Batch, raw: Input, kind: str) -> Columns:
    """``keep_columns`` values: from the preprocessed batch, else from the raw input."""
    kept: Columns = {}
    for c in columns:
        for source in (batch, raw):
            if not isinstance(source, np.ndarray) and c in _names(source):
                kept[c] = _column(source[c])
                break
    missing = [c for c in columns if c not in kept]
    if missing:
        raise ValueError(
            f"keep_columns names column(s) {missing} that the data lacks (it has "
            f"{_describe_names(raw)}).\nHINT: check the spelling; a kept column comes from the "
            "preprocessed batch or, if the preprocessor dropped it, from the raw input."
        )
    return kept


def _select(batch: Batch, columns: list[object]) -> Batch:  # names, or indices for a matrix
    if isinstance(batch, np.ndarray):
        indices = [c for c in columns if isinstance(c, int)]
        if len(indices) != len(columns):
            raise ValueError(
                f"feature_columns={columns} on a numpy array must be column indices (ints)."
            )
        return batch[:, indices]
    have = _names(batch)
    missing = [c for c in columns if c not in have]
    if missing:
        raise ValueError(
            f"feature_columns names column(s) {missing} that the data lacks after "
            f"preprocessing (it has {_describe_names(batch)}).\nHINT: check the column names, "
            "and what the checkpoint's preprocessor outputs."
        )
    if isinstance(batch, pd.DataFrame):
        return batch[columns]
    return {c: batch[c] for c in cast("list[str]", columns)}  # a dict's: names, checked above


def _names(data: Input) -> list[object]:
    if isinstance(data, pd.DataFrame):
        return list(data.columns)
    if isinstance(data, pa.Table):
        return list(data.column_names)
    return list(data)


def _describe_names(data: Input, limit: int = 20) -> str:
    if isinstance(data, np.ndarray):
        return f"no column names: a numpy array of shape {data.shape}"
    names = [str(n) for n in _names(data)]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{names[:limit]}{more}"


def _column(values: object) -> np.ndarray:
    array = values.to_numpy() if isinstance(values, pd.Series | pa.ChunkedArray) else values
    array = np.asarray(array)
    if array.dtype == object and len(array) and isinstance(array[0], np.ndarray | list):
        try:
            array = np.stack([np.asarray(v) for v in array])
        except ValueError:  # rows of different lengths stay one object per row
            pass
    return array


def _numpy_to_frame(batch: np.ndarray | dict[str, np.ndarray]) -> pd.DataFrame:
    if isinstance(batch, np.ndarray):
        if batch.ndim <= 2:
            return pd.DataFrame(batch)
        return pd.DataFrame({TENSOR_COLUMN: list(batch)})
    return _to_pandas(batch)


def _pandas_to_numpy(df: pd.DataFrame) -> dict[str, np.ndarray]:
    out = {}
    for c in df.columns:
        values = df[c].to_numpy()
        if values.dtype == object and len(values) and isinstance(values[0], np.ndarray | list):
            values = np.stack([np.asarray(v) for v in values])
        out[str(c)] = values
    return out


def _to_pandas(arrays: Columns) -> pd.DataFrame:
    return pd.DataFrame({k: (list(v) if np.ndim(v) > 1 else v) for k, v in arrays.items()})


def to_arrow(out: Columns | pd.DataFrame) -> pa.Table:
    """A prediction (a dict of arrays or a DataFrame) as a pyarrow Table; a column of
    arrays becomes a fixed-size list column."""
    if isinstance(out, dict):
        columns = {}
        for name, values in out.items():
            if getattr(values, "ndim", 1) > 1:
                flat = pa.array(values.reshape(len(values), -1).ravel())
                columns[name] = pa.FixedSizeListArray.from_arrays(flat, values[0].size)
            else:
                columns[name] = pa.array(values)
        return pa.table(columns)
    from phalanx.preprocess._base import pandas_to_numpy

    return to_arrow(pandas_to_numpy(out))

"""Concatenator (columns -> one tensor column) and Chain (preprocessors applied in order)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from phalanx.preprocess.base import (
    Batches,
    FitStatus,
    Preprocessor,
    pandas_to_numpy,
)

__all__ = ["Chain", "Concatenator"]


class Concatenator(Preprocessor):
    """Pack numeric ``columns`` into one 2-D column ``output_column_name`` (a numpy array per
    row in pandas; a ``(rows, n)`` array in numpy batches) and drop them. Missing columns are
    skipped unless ``raise_if_missing``.

    Example::

        Concatenator(columns=["a", "b"], output_column_name="x").transform_batch(df)["x"]
    """

    _is_fittable = False

    def __init__(
        self,
        columns: list[str],
        output_column_name: str = "concat_out",
        *,
        dtype: Any = None,
        raise_if_missing: bool = False,
        flatten: bool = False,
    ) -> None:
        super().__init__()
        self.columns = list(columns)
        self.output_column_name = output_column_name
        self.dtype = dtype
        self.raise_if_missing = raise_if_missing
        self.flatten = flatten

    def _input_columns(self) -> list[str]:
        return self.columns if self.raise_if_missing else []

    def _transform_numpy(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        present = [c for c in self.columns if c in batch]
        parts = [np.asarray(batch[c]).reshape(len(batch[c]), -1) for c in present]
        packed = np.concatenate(parts, axis=1) if parts else np.empty((0, 0))
        if self.dtype is not None:
            packed = packed.astype(self.dtype)
        out = {k: v for k, v in batch.items() if k not in present}
        out[self.output_column_name] = packed
        return out

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        packed = self._transform_numpy(pandas_to_numpy(df[[c for c in self.columns if c in df]]))
        out = df.drop(columns=[c for c in self.columns if c in df.columns])
        out[self.output_column_name] = list(packed[self.output_column_name])
        return out


class Chain(Preprocessor):
    """Preprocessors applied in order. ``fit`` fits each on the output of the ones before it,
    streaming (the earlier ones' ``transform_batch`` is applied to each batch as it is read).

    Example::

        Chain(SimpleImputer(["a"]), StandardScaler(["a"]), Concatenator(["a", "b"], "x"))
    """

    def __init__(self, *preprocessors: Preprocessor) -> None:
        super().__init__()
        self.preprocessors = list(preprocessors)
        self._is_fittable = any(p._is_fittable for p in self.preprocessors)

    def fit_status(self) -> FitStatus:
        statuses = [p.fit_status() for p in self.preprocessors if p._is_fittable]
        if not statuses:
            return FitStatus.NOT_FITTABLE
        if all(s == FitStatus.FITTED for s in statuses):
            return FitStatus.FITTED
        if any(s == FitStatus.FITTED for s in statuses):
            return FitStatus.PARTIALLY_FITTED
        return FitStatus.NOT_FITTED

    def _check_fitted(self) -> None:
        for p in self.preprocessors:
            p._check_fitted()

    def _input_columns(self) -> list[str]:
        return self.preprocessors[0]._input_columns() if self.preprocessors else []

    def _fit_batches(self, batches: Batches) -> None:
        for i, p in enumerate(self.preprocessors):
            if p._is_fittable:
                p._fit_batches(_through(self.preprocessors[:i], batches))
        self._fitted = True

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        for p in self.preprocessors:
            df = p._transform_pandas(df)
        return df

    def _transform_numpy(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for p in self.preprocessors:
            batch = p._transform_numpy(batch)
        return batch

    def __repr__(self) -> str:
        return f"Chain({', '.join(map(repr, self.preprocessors))})"


def _through(before: list[Preprocessor], batches: Batches) -> Batches:
    def transformed() -> Iterator[pd.DataFrame]:
        for batch in batches():
            for p in before:
                batch = p._transform_pandas(batch)
            yield batch

    return transformed

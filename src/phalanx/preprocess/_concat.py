"""Concatenator (columns -> one tensor column) and Chain (preprocessors applied in order)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from phalanx.preprocess._base import (
    Batches,
    FitStatus,
    Preprocessor,
    pandas_to_numpy,
)

if TYPE_CHECKING:
    from numpy.typing import DTypeLike


__all__ = ["Chain", "Concatenator"]


class Concatenator(Preprocessor):
    """Pack numeric ``columns`` into one 2-D column ``output_column_name`` (a numpy array per
    row in pandas; a ``(rows, n)`` array in numpy batches) and drop them. Missing columns are
    skipped unless ``raise_if_missing``. AIR's ``include`` / ``exclude`` (keywords) work too:
    without ``columns``, every column of the batch in ``include`` (default: all) and not in
    ``exclude`` is packed, in the batch's order.

    Example::

        Concatenator(columns=["a", "b"], output_column_name="x").transform_batch(df)["x"]
        Concatenator(output_column_name="features", exclude=["label"])  # AIR's form
    """

    _is_fittable = False

    def __init__(
        self,
        columns: list[str] | None = None,
        output_column_name: str = "concat_out",
        *,
        include: list[str] | None = None,
        exclude: str | list[str] | None = None,
        dtype: DTypeLike | None = None,
        raise_if_missing: bool = False,
        flatten: bool = False,
    ) -> None:
        super().__init__()
        if columns is not None and (include is not None or exclude is not None):
            raise ValueError(
                "Concatenator takes columns, or include/exclude (AIR's form), not both."
            )
        self.columns = None if columns is None else list(columns)
        self.include = None if include is None else list(include)
        self.exclude = [exclude] if isinstance(exclude, str) else list(exclude or [])
        self.output_column_name = output_column_name
        self.dtype = dtype
        self.raise_if_missing = raise_if_missing
        self.flatten = flatten

    def _input_columns(self) -> list[str]:
        if not self.raise_if_missing:
            return []
        if self.columns is not None:
            return self.columns
        return [*(self.include or []), *self.exclude]

    def _packed(self, names: list[str]) -> list[str]:
        """The columns of a batch with ``names`` that are packed, in order."""
        if self.columns is not None:
            return [c for c in self.columns if c in names]
        chosen = names if self.include is None else [c for c in self.include if c in names]
        return [c for c in chosen if c not in self.exclude]

    def _transform_numpy(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        present = self._packed([str(c) for c in batch])
        parts = [np.asarray(batch[c]).reshape(len(batch[c]), -1) for c in present]
        packed = np.concatenate(parts, axis=1) if parts else np.empty((0, 0))
        if self.dtype is not None:
            packed = packed.astype(self.dtype)
        out = {k: v for k, v in batch.items() if k not in present}
        out[self.output_column_name] = packed
        return out

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        present = self._packed([str(c) for c in df.columns])
        packed = self._transform_numpy(pandas_to_numpy(df[present]))
        out = df.drop(columns=present)
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

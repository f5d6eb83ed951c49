"""SimpleImputer: fill missing values with the column's mean, its most frequent value or a
constant."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from phalanx.preprocess._base import Batches, Preprocessor, output_names

__all__ = ["SimpleImputer"]

STRATEGIES = ("mean", "most_frequent", "constant")


class SimpleImputer(Preprocessor):
    """Missing values (None/NaN) -> the column's mean, most frequent value (the smallest among
    ties, as scikit-learn picks) or ``fill_value``. A column missing from a batch is added,
    filled.

    Example::

        SimpleImputer(columns=["age"], strategy="mean").fit(df).transform_batch(df)
    """

    def __init__(
        self,
        columns: list[str],
        strategy: str = "mean",
        fill_value: object = None,
        *,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy={strategy!r} is invalid: use one of {STRATEGIES}.")
        if strategy == "constant" and fill_value is None:
            raise ValueError('strategy="constant" needs a fill_value.')
        self.columns = list(columns)
        self.strategy = strategy
        self.fill_value = fill_value
        self.output_columns = output_names(self.columns, output_columns)
        self._is_fittable = strategy != "constant"

    def _fit(self, batches: Batches) -> None:
        sums = {c: 0.0 for c in self.columns}
        counts = {c: 0 for c in self.columns}
        freq: dict[str, Counter[Any]] = {c: Counter() for c in self.columns}
        for batch in batches():
            for c in self.columns:
                values = batch[c].dropna()
                if self.strategy == "mean":
                    sums[c] += float(pd.to_numeric(values).sum())
                    counts[c] += len(values)
                else:
                    freq[c].update(values.value_counts(sort=False).to_dict())
        for c in self.columns:
            if self.strategy == "mean":
                self.stats_[f"mean({c})"] = sums[c] / counts[c] if counts[c] else np.nan
            else:
                top = max(freq[c].values(), default=0)
                ties = [v for v, n in freq[c].items() if n == top]
                self.stats_[f"most_frequent({c})"] = min(ties) if ties else None

    def _input_columns(self) -> list[str]:
        return []  # a missing column is filled entirely

    def _value(self, column: str) -> object:
        if self.strategy == "constant":
            return self.fill_value
        return self.stats_[f"{self.strategy}({column})"]

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        for c, out in zip(self.columns, self.output_columns, strict=True):
            value = self._value(c)
            if c not in df.columns:
                df[out] = [value] * len(df)
            else:
                df[out] = df[c].fillna(value)
        return df

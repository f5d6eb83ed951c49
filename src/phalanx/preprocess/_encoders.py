"""OrdinalEncoder, OneHotEncoder, LabelEncoder: categories found by streaming value counts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from phalanx.preprocess._base import Batches, Preprocessor, output_names

__all__ = ["LabelEncoder", "OneHotEncoder", "OrdinalEncoder"]


def _count_values(batches: Batches, columns: list[str], lists: bool) -> dict[str, Counter[Any]]:
    counts: dict[str, Counter[Any]] = {c: Counter() for c in columns}
    for batch in batches():
        for c in columns:
            values = batch[c].dropna()
            if lists and len(values) and isinstance(values.iloc[0], list | np.ndarray):
                values = values.explode().dropna()
            counts[c].update(values.value_counts(sort=False).to_dict())
    return counts


def _sorted(values: Any) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:  # mixed types: order by their text
        return sorted(values, key=str)


class OrdinalEncoder(Preprocessor):
    """Each value -> its index among the column's sorted unique values; unseen values -> NaN.
    List values are encoded element by element when ``encode_lists`` (the default).

    Example::

        OrdinalEncoder(columns=["color"]).fit(df).transform_batch(df)
    """

    def __init__(
        self,
        columns: list[str],
        *,
        encode_lists: bool = True,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.columns = list(columns)
        self.encode_lists = encode_lists
        self.output_columns = output_names(self.columns, output_columns)

    def _fit(self, batches: Batches) -> None:
        counts = _count_values(batches, self.columns, self.encode_lists)
        for c in self.columns:
            self.stats_[f"unique_values({c})"] = {v: i for i, v in enumerate(_sorted(counts[c]))}

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        for c, out in zip(self.columns, self.output_columns, strict=True):
            index = self.stats_[f"unique_values({c})"]
            col = df[c]
            if self.encode_lists and len(col) and isinstance(col.iloc[0], list | np.ndarray):
                df[out] = [[index.get(v, np.nan) for v in row] for row in col]
                continue
            codes = col.map(index)
            df[out] = codes.astype(np.int64) if codes.notna().all() else codes.astype(float)
        return df


class OneHotEncoder(Preprocessor):
    """Each column -> a one-hot numpy vector over its sorted categories (the ``max_categories``
    most frequent ones when given); unseen values -> all zeros.

    Example::

        OneHotEncoder(columns=["color"]).fit(df).transform_batch(df)["color"]
    """

    def __init__(
        self,
        columns: list[str],
        *,
        max_categories: dict[str, int] | None = None,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.columns = list(columns)
        self.max_categories = dict(max_categories or {})
        self.output_columns = output_names(self.columns, output_columns)

    def _fit(self, batches: Batches) -> None:
        counts = _count_values(batches, self.columns, lists=False)
        for c in self.columns:
            values = list(counts[c])
            k = self.max_categories.get(c)
            if k is not None:  # the k most frequent (ties: in sorted order)
                order = {v: i for i, v in enumerate(_sorted(values))}
                values = sorted(values, key=lambda v: (-counts[c][v], order[v]))[:k]
            self.stats_[f"unique_values({c})"] = {v: i for i, v in enumerate(_sorted(values))}

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        for c, out in zip(self.columns, self.output_columns, strict=True):
            df[out] = list(self._encode(c, df[c]))
        return df

    def _transform_numpy(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(batch)
        for c, name in zip(self.columns, self.output_columns, strict=True):
            out[name] = self._encode(c, pd.Series(batch[c]))
        return out

    def _encode(self, column: str, values: pd.Series) -> np.ndarray:
        index = self.stats_[f"unique_values({column})"]
        codes = values.map(index).to_numpy(dtype=np.float64)
        onehot = np.zeros((len(values), len(index)), dtype=np.int64)
        known = ~np.isnan(codes)
        onehot[np.nonzero(known)[0], codes[known].astype(np.int64)] = 1
        return onehot


class LabelEncoder(Preprocessor):
    """The label column's values -> their index among its sorted unique values.

    Example::

        encoder = LabelEncoder(label_column="y").fit(df)
        encoder.inverse_transform_batch(encoder.transform_batch(df))
    """

    def __init__(self, label_column: str, *, output_column: str | None = None) -> None:
        super().__init__()
        self.label_column = label_column
        self.output_column = output_column or label_column

    def _input_columns(self) -> list[str]:
        return [self.label_column]

    def _fit(self, batches: Batches) -> None:
        counts = _count_values(batches, [self.label_column], lists=False)
        values = _sorted(counts[self.label_column])
        self.stats_[f"unique_values({self.label_column})"] = {v: i for i, v in enumerate(values)}

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        index = self.stats_[f"unique_values({self.label_column})"]
        codes = df[self.label_column].map(index)
        df[self.output_column] = (
            codes.astype(np.int64) if codes.notna().all() else codes.astype(float)
        )
        return df

    def inverse_transform_batch(self, df: pd.DataFrame) -> pd.DataFrame:
        """Indices in ``output_column`` back to the original labels (in ``label_column``)."""
        self._check_fitted()
        values = list(self.stats_[f"unique_values({self.label_column})"])
        df = df.copy()
        df[self.label_column] = [values[int(i)] for i in df[self.output_column]]
        return df

    def __repr__(self) -> str:
        return f"LabelEncoder(label_column={self.label_column!r})"

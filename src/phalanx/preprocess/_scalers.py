"""StandardScaler and MinMaxScaler: per-column statistics merged batch by batch."""

from __future__ import annotations

import numpy as np
import pandas as pd

from phalanx.preprocess._base import Batches, Preprocessor, output_names

__all__ = ["MinMaxScaler", "StandardScaler"]


class StandardScaler(Preprocessor):
    """``(x - mean) / std`` per column (population std; a constant column is only centred).

    Example::

        scaler = StandardScaler(columns=["a", "b"]).fit(df)
        scaler.transform_batch(df)
    """

    def __init__(self, columns: list[str], output_columns: list[str] | None = None) -> None:
        super().__init__()
        self.columns = list(columns)
        self.output_columns = output_names(self.columns, output_columns)

    def _fit(self, batches: Batches) -> None:
        # Chan et al.'s pairwise merge of (count, mean, M2): stable, one pass, O(columns) memory.
        n = {c: 0 for c in self.columns}
        mean = {c: 0.0 for c in self.columns}
        m2 = {c: 0.0 for c in self.columns}
        for batch in batches():
            for c in self.columns:
                x = pd.to_numeric(batch[c]).to_numpy(dtype=np.float64)
                x = x[~np.isnan(x)]
                if not len(x):
                    continue
                nb, mb = len(x), float(x.mean())
                m2b = float(((x - mb) ** 2).sum())
                total = n[c] + nb
                delta = mb - mean[c]
                mean[c] += delta * nb / total
                m2[c] += m2b + delta**2 * n[c] * nb / total
                n[c] = total
        for c in self.columns:
            self.stats_[f"mean({c})"] = mean[c] if n[c] else float("nan")
            self.stats_[f"std({c})"] = float(np.sqrt(m2[c] / n[c])) if n[c] else float("nan")

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        for c, out in zip(self.columns, self.output_columns, strict=True):
            std = self.stats_[f"std({c})"]
            std = 1.0 if std == 0 or np.isnan(std) else std
            df[out] = (pd.to_numeric(df[c]).astype(np.float64) - self.stats_[f"mean({c})"]) / std
        return df


class MinMaxScaler(Preprocessor):
    """``(x - min) / (max - min)`` per column (a constant column becomes 0).

    Example::

        MinMaxScaler(columns=["a"]).fit(df).transform_batch(df)
    """

    def __init__(self, columns: list[str], output_columns: list[str] | None = None) -> None:
        super().__init__()
        self.columns = list(columns)
        self.output_columns = output_names(self.columns, output_columns)

    def _fit(self, batches: Batches) -> None:
        lo: dict[str, float] = {c: np.inf for c in self.columns}
        hi: dict[str, float] = {c: -np.inf for c in self.columns}
        for batch in batches():
            for c in self.columns:
                x = pd.to_numeric(batch[c])
                if x.notna().any():
                    lo[c] = min(lo[c], float(x.min()))
                    hi[c] = max(hi[c], float(x.max()))
        for c in self.columns:
            self.stats_[f"min({c})"] = lo[c]
            self.stats_[f"max({c})"] = hi[c]

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        for c, out in zip(self.columns, self.output_columns, strict=True):
            lo, hi = self.stats_[f"min({c})"], self.stats_[f"max({c})"]
            span = hi - lo
            span = 1.0 if span == 0 or not np.isfinite(span) else span
            df[out] = (pd.to_numeric(df[c]).astype(np.float64) - lo) / span
        return df

"""Synthetic tabular data and quality measures for the XGBoost / LightGBM tests."""

from __future__ import annotations

import numpy as np
import pandas as pd


def make_classification(rows: int, features: int = 8, seed: int = 0) -> pd.DataFrame:
    """A binary label from a non-linear function of the first features, plus noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    logit = x[:, 0] + x[:, 1] * x[:, 2] - 0.5 * x[:, 3] ** 2 + rng.normal(size=rows) * 0.5
    df = pd.DataFrame(x, columns=[f"f{i}" for i in range(features)])
    df["y"] = (logit > 0).astype(np.int64)
    return df


def make_regression(rows: int, features: int = 8, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    target = 3 * x[:, 0] + np.sin(2 * x[:, 1]) * 2 + x[:, 2] * x[:, 3] + rng.normal(size=rows) * 0.3
    df = pd.DataFrame(x, columns=[f"f{i}" for i in range(features)])
    df["y"] = target
    return df


def auc(y: np.ndarray, score: np.ndarray) -> float:
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def rmse(y: np.ndarray, prediction: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(y) - prediction) ** 2)))

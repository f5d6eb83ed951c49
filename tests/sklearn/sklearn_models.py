"""Data and estimators for the phalanx.sklearn tests (importable by worker and loky processes)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import Ridge

import phalanx


def regression(rows: int = 400, seed: int = 0, offset: float = 0.0) -> pd.DataFrame:
    """Four features (``offset`` added to each) and ``y``, a noisy linear function of them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4))
    y = x @ np.array([1.5, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=rows)
    df = pd.DataFrame(x + offset, columns=["a", "b", "c", "d"])
    df["y"] = y
    return df


def classification(rows: int = 400, seed: int = 0) -> pd.DataFrame:
    df = regression(rows, seed)
    df["y"] = (df["y"] > 0).astype(int)
    return df


class PidRidge(BaseEstimator, RegressorMixin):
    """Ridge that appends ``<pid>`` to ``log`` on every fit (no CPU parameter of its own)."""

    def __init__(self, log: str = "", alpha: float = 1.0) -> None:
        self.log = log
        self.alpha = alpha

    def fit(self, X, y):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        self.model_ = Ridge(alpha=self.alpha).fit(X, y)
        return self

    def predict(self, X):
        return self.model_.predict(X)


class KilledOnFirstAttempt(PidRidge):
    """Logs ``<attempt>`` on every fit, and SIGKILLs its worker during the first attempt's."""

    def fit(self, X, y):
        attempt = phalanx.get_context().get_attempt()
        with open(self.log, "a") as f:
            f.write(f"{attempt}\n")
        if attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        self.model_ = Ridge(alpha=self.alpha).fit(X, y)
        return self

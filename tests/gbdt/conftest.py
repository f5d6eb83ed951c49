"""Fixtures for the XGBoost / LightGBM tests (data helpers live in gbdt_data.py)."""

from __future__ import annotations

import pandas as pd
import pytest
from gbdt_data import make_classification, make_regression

import phalanx


@pytest.fixture(scope="session")
def classification() -> tuple[pd.DataFrame, pd.DataFrame]:
    df = make_classification(24_000)
    return df.iloc[:20_000].reset_index(drop=True), df.iloc[20_000:].reset_index(drop=True)


@pytest.fixture(scope="session")
def regression() -> tuple[pd.DataFrame, pd.DataFrame]:
    df = make_regression(24_000, seed=1)
    return df.iloc[:20_000].reset_index(drop=True), df.iloc[20_000:].reset_index(drop=True)


@pytest.fixture
def run_config(tmp_path) -> phalanx.RunConfig:
    return phalanx.RunConfig(storage_path=str(tmp_path / "runs"))

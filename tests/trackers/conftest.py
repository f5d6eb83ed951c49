"""Fixtures for the tracker tests: one MLflow SQLite store per module, wandb's service stopped."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory):
    """One SQLite store for the module: creating its tables takes seconds. MLflow's telemetry
    (which sets an environment variable on first use) is off while this module runs."""
    MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient
    pytest.importorskip("sqlalchemy")
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        with contextlib.chdir(root):  # the Default experiment's artifact root is ./mlruns
            MlflowClient(uri).search_experiments()
        yield uri


@pytest.fixture
def wandb_service():
    wandb = pytest.importorskip("wandb")
    yield
    wandb.teardown()  # stop wandb-core, the service process wandb.init started

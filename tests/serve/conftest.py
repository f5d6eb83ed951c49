"""Checkpoints from real (small) training runs with a preprocessor, one per framework, trained
once per session."""

from __future__ import annotations

import contextlib

import pytest

with contextlib.suppress(ImportError):  # lightgbm sets KMP_* variables when first imported
    import lightgbm  # noqa: F401
with contextlib.suppress(ImportError):
    import xgboost  # noqa: F401

from serve_models import train_run

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """{"torch"|"xgboost"|"lightgbm": Result}, trained lazily."""
    root = tmp_path_factory.mktemp("serve_runs")
    cache: dict[str, object] = {}

    def get(framework: str):
        if framework not in cache:
            cache[framework] = train_run(framework, str(root))
        return cache[framework]

    return get

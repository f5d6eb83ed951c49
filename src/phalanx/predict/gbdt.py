"""XGBoostPredictor and LightGBMPredictor: a booster loaded from a checkpoint, on DataFrames."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from phalanx.checkpoint import Checkpoint
from phalanx.predict.base import (
    FRAMEWORK_FILES,
    Predictor,
    check_framework,
    load_preprocessor,
)

__all__ = ["LightGBMPredictor", "XGBoostPredictor"]


def _model_file(checkpoint: Checkpoint, framework: str, directory: str) -> str:
    for name in FRAMEWORK_FILES[framework]:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(
        f"{checkpoint!r} has none of {list(FRAMEWORK_FILES[framework])}.\nHINT: pass a "
        f"checkpoint saved by the {framework} trainer or its ReportCallback."
    )


def _columns(predictions: np.ndarray) -> pd.DataFrame:
    if predictions.ndim == 1:
        return pd.DataFrame({"predictions": predictions})
    return pd.DataFrame(
        {f"predictions_{i}": predictions[:, i] for i in range(predictions.shape[1])}
    )


class XGBoostPredictor(Predictor):
    """Predicts with an ``xgboost.Booster``: a ``predictions`` column (``predictions_<i>`` for
    several outputs per row).

    Example::

        XGBoostPredictor.from_checkpoint(result.checkpoint).predict(df)
    """

    def __init__(self, model: Any, preprocessor: Any = None) -> None:
        super().__init__(preprocessor)
        self.model = model

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, **kwargs: Any) -> XGBoostPredictor:
        import xgboost

        check_framework(checkpoint, "xgboost", cls.__name__)
        booster = xgboost.Booster()
        with checkpoint.as_directory() as directory:
            booster.load_model(_model_file(checkpoint, "xgboost", directory))
        return cls(booster, preprocessor=load_preprocessor(checkpoint), **kwargs)

    def _predict_pandas(
        self, data: pd.DataFrame, dmatrix_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> pd.DataFrame:
        import xgboost

        matrix = xgboost.DMatrix(data, **(dmatrix_kwargs or {}))
        return _columns(np.asarray(self.model.predict(matrix, **kwargs)))


class LightGBMPredictor(Predictor):
    """Predicts with a ``lightgbm.Booster``: a ``predictions`` column (``predictions_<i>`` for
    several outputs per row).

    Example::

        LightGBMPredictor.from_checkpoint(result.checkpoint).predict(df)
    """

    def __init__(self, model: Any, preprocessor: Any = None) -> None:
        super().__init__(preprocessor)
        self.model = model

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, **kwargs: Any) -> LightGBMPredictor:
        import lightgbm

        check_framework(checkpoint, "lightgbm", cls.__name__)
        with checkpoint.as_directory() as directory:
            booster = lightgbm.Booster(model_file=_model_file(checkpoint, "lightgbm", directory))
        return cls(booster, preprocessor=load_preprocessor(checkpoint), **kwargs)

    def _predict_pandas(self, data: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
        return _columns(np.asarray(self.model.predict(data, **kwargs)))

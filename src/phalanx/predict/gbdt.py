"""XGBoostPredictor and LightGBMPredictor: a booster loaded from a checkpoint, on batches."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from phalanx.checkpoint import Checkpoint
from phalanx.predict.base import (
    FRAMEWORK_FILES,
    TENSOR_COLUMN,
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


def _features(data: Any) -> Any:
    """What the booster gets: a DataFrame (its column names become feature names) or a
    matrix (a numpy array, or Ray's single tensor column of per-row arrays)."""
    if isinstance(data, np.ndarray):
        return data
    if isinstance(data, dict):
        if all(np.ndim(v) == 1 for v in data.values()):
            return pd.DataFrame(data)
        return np.column_stack([np.asarray(v).reshape(len(v), -1) for v in data.values()])
    if list(data.columns) == [TENSOR_COLUMN]:
        return np.stack(data[TENSOR_COLUMN].to_numpy())
    return data


class XGBoostPredictor(Predictor):
    """Predicts with an ``xgboost.Booster``: a ``predictions`` column (``predictions_<i>`` for
    several outputs per row). Takes a DataFrame, a numpy matrix, a dict of arrays or a pyarrow
    Table, and returns the same kind (a dict of arrays for numpy input).

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

    def predict(  # type: ignore[override]
        self,
        data: Any,
        feature_columns: list[str] | list[int] | None = None,
        dmatrix_kwargs: dict[str, Any] | None = None,
        **predict_kwargs: Any,
    ) -> Any:
        """``dmatrix_kwargs`` go to ``xgboost.DMatrix``, ``predict_kwargs`` to
        ``Booster.predict`` (``keep_columns=`` is phalanx's, as on every predictor)."""
        return super().predict(
            data, feature_columns=feature_columns, dmatrix_kwargs=dmatrix_kwargs, **predict_kwargs
        )

    def _predict_pandas(
        self, data: pd.DataFrame, dmatrix_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> pd.DataFrame:
        import xgboost

        matrix = xgboost.DMatrix(_features(data), **(dmatrix_kwargs or {}))
        return _columns(np.asarray(self.model.predict(matrix, **kwargs)))

    def _predict_numpy(  # type: ignore[override]
        self, data: Any, dmatrix_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> dict[str, np.ndarray]:
        frame = self._predict_pandas(_features(data), dmatrix_kwargs, **kwargs)  # type: ignore[arg-type]
        return {str(c): frame[c].to_numpy() for c in frame.columns}


class LightGBMPredictor(Predictor):
    """Predicts with a ``lightgbm.Booster``: a ``predictions`` column (``predictions_<i>`` for
    several outputs per row). Takes a DataFrame, a numpy matrix, a dict of arrays or a pyarrow
    Table, and returns the same kind (a dict of arrays for numpy input).

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

    def predict(  # type: ignore[override]
        self,
        data: Any,
        feature_columns: list[str] | list[int] | None = None,
        **predict_kwargs: Any,
    ) -> Any:
        """``predict_kwargs`` go to ``lightgbm.Booster.predict``."""
        return super().predict(data, feature_columns=feature_columns, **predict_kwargs)

    def _predict_pandas(self, data: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
        return _columns(np.asarray(self.model.predict(_features(data), **kwargs)))

    def _predict_numpy(self, data: Any, **kwargs: Any) -> dict[str, np.ndarray]:  # type: ignore[override]
        frame = self._predict_pandas(_features(data), **kwargs)
        return {str(c): frame[c].to_numpy() for c in frame.columns}

"""The base of ``XGBoostPredictor`` and ``LightGBMPredictor``: a booster loaded from a
checkpoint, applied to batches."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import numpy as np
import pandas as pd

from phalanx._foundation.checkpoint_files import (
    MODEL_FILES,
    check_framework,
    find_model_file,
    load_preprocessor,
)
from phalanx._gbdt.library import BoostingLibrary
from phalanx.checkpoint import Checkpoint
from phalanx.predict._base import TENSOR_COLUMN, BatchPreprocessor, Predictor

__all__ = ["BoosterPredictor", "as_features", "check_width", "prediction_columns"]

SelfPredictor = TypeVar("SelfPredictor", bound="BoosterPredictor")


class BoosterPredictor(Predictor):
    """Predicts with a booster: a ``predictions`` column (``predictions_<i>`` for several
    outputs per row). Subclasses set ``_library`` and define ``_predict_pandas``."""

    _library: ClassVar[BoostingLibrary[Any]]  # the subclass's library, with its own model type

    def __init__(
        self, model: Any, preprocessor: BatchPreprocessor | None = None
    ) -> None:  # model: the library's
        super().__init__(preprocessor)
        self.model = model

    @classmethod
    def from_checkpoint(
        cls: type[SelfPredictor], checkpoint: Checkpoint, **kwargs: object
    ) -> SelfPredictor:
        library = cls._library
        check_framework(checkpoint, library.framework, cls.__name__)
        hint = f"pass a checkpoint saved by the {library.framework} trainer or its ReportCallback."
        with checkpoint.as_directory() as directory:
            names = MODEL_FILES.get(library.framework, (library.model_file,))
            path = find_model_file(checkpoint, directory, names, hint)
            booster = library.load_model(path)
        return cls(booster, preprocessor=load_preprocessor(checkpoint), **kwargs)

    def _predict_numpy(
        self, data: np.ndarray | dict[str, np.ndarray], **kwargs: object
    ) -> dict[str, np.ndarray]:

        frame = self._predict_pandas(as_features(data), **kwargs)
        return {str(c): frame[c].to_numpy() for c in frame.columns}


def prediction_columns(predictions: np.ndarray) -> pd.DataFrame:
    if predictions.ndim == 1:
        return pd.DataFrame({"predictions": predictions})
    return pd.DataFrame(
        {f"predictions_{i}": predictions[:, i] for i in range(predictions.shape[1])}
    )


def as_features(
    data: np.ndarray | dict[str, np.ndarray] | pd.DataFrame,
) -> np.ndarray | pd.DataFrame:
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


def check_width(features: object, expected: int, names: list[str] | None) -> None:
    """A matrix without column names is read in the trained feature order; it must have one
    column per feature (the libraries' own errors name neither the features nor the fix)."""
    if not isinstance(features, np.ndarray) or features.ndim != 2:
        return
    if features.shape[1] == expected:
        return
    shown = f" {names[:20]}" if names else ""
    raise ValueError(
        f"The array to predict on has {features.shape[1]} columns, but the model was trained "
        f"on {expected} feature(s){shown}: an array without column names is read as those "
        "features, in that order.\nHINT: pass exactly those columns, or a DataFrame or dict "
        "of arrays with the feature names, or pick the columns with feature_columns=[...]."
    )

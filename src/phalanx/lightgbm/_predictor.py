"""LightGBMPredictor: a ``lightgbm.Booster`` loaded from a checkpoint, on batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from phalanx._gbdt.predictor import (
    BoosterPredictor,
    as_features,
    check_width,
    prediction_columns,
)
from phalanx.lightgbm._library import LIGHTGBM

__all__ = ["LightGBMPredictor"]


class LightGBMPredictor(BoosterPredictor):
    """Predicts with a ``lightgbm.Booster``: a ``predictions`` column (``predictions_<i>`` for
    several outputs per row). Takes a DataFrame, a numpy matrix, a dict of arrays or a pyarrow
    Table, and returns the same kind (a dict of arrays for numpy input).

    Example::

        LightGBMPredictor.from_checkpoint(result.checkpoint).predict(df)
    """

    _library = LIGHTGBM

    def predict(
        self,
        data: Any,
        feature_columns: list[str] | list[int] | None = None,
        **predict_kwargs: Any,
    ) -> Any:
        """``predict_kwargs`` go to ``lightgbm.Booster.predict``."""
        return super().predict(data, feature_columns=feature_columns, **predict_kwargs)

    def _predict_pandas(self, data: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
        features = as_features(data)
        check_width(features, self.model.num_feature(), self.model.feature_name())
        return prediction_columns(np.asarray(self.model.predict(features, **kwargs)))

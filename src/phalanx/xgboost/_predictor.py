"""XGBoostPredictor: an ``xgboost.Booster`` loaded from a checkpoint, on batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from phalanx._internal.gbdt.predictor import BoosterPredictor, as_features, prediction_columns
from phalanx.xgboost._library import XGBOOST

__all__ = ["XGBoostPredictor"]


class XGBoostPredictor(BoosterPredictor):
    """Predicts with an ``xgboost.Booster``: a ``predictions`` column (``predictions_<i>`` for
    several outputs per row). Takes a DataFrame, a numpy matrix, a dict of arrays or a pyarrow
    Table, and returns the same kind (a dict of arrays for numpy input).

    Example::

        XGBoostPredictor.from_checkpoint(result.checkpoint).predict(df)
    """

    _library = XGBOOST

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

        matrix = xgboost.DMatrix(as_features(data), **(dmatrix_kwargs or {}))
        return prediction_columns(np.asarray(self.model.predict(matrix, **kwargs)))

"""XGBoostPredictor: an ``xgboost.Booster`` loaded from a checkpoint, on batches."""

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

    def predict(
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

        features = as_features(data)
        options = dict(dmatrix_kwargs or {})
        if isinstance(features, np.ndarray):
            names = self.model.feature_names
            check_width(features, self.model.num_features(), names)
            # A model trained on named columns rejects a nameless matrix; AIR's predicted on
            # it, reading the columns in the trained order.
            if names is not None:
                options.setdefault("feature_names", names)
        matrix = xgboost.DMatrix(features, **options)
        return prediction_columns(np.asarray(self.model.predict(matrix, **kwargs)))

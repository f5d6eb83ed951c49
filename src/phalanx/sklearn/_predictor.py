"""SklearnPredictor: a scikit-learn estimator loaded from a checkpoint, on batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from phalanx._foundation.checkpoint_files import check_framework, load_preprocessor
from phalanx._gbdt.predictor import as_features, prediction_columns
from phalanx.checkpoint import Checkpoint
from phalanx.predict._base import BatchPreprocessor, Predictor
from phalanx.sklearn._checkpoint import load_estimator
from phalanx.sklearn._estimator import set_cpu_params

if TYPE_CHECKING:
    from sklearn.base import BaseEstimator

__all__ = ["SklearnPredictor"]


class SklearnPredictor(Predictor):
    """Predicts with a fitted estimator's ``predict``: a ``predictions`` column
    (``predictions_<i>`` for several outputs per row). Takes a DataFrame, a numpy matrix, a
    dict of arrays or a pyarrow Table, and returns the same kind (a dict of arrays for numpy
    input); the checkpoint's preprocessor is applied first.

    Example::

        predictor = SklearnPredictor.from_checkpoint(result.checkpoint)
        predictor.predict(df, feature_columns=["x1", "x2"])
    """

    def __init__(
        self, estimator: BaseEstimator, preprocessor: BatchPreprocessor | None = None
    ) -> None:
        super().__init__(preprocessor)
        self.estimator = estimator

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, **kwargs: object) -> SklearnPredictor:
        """The estimator and preprocessor saved by SklearnTrainer or
        ``SklearnCheckpoint.from_estimator``."""
        check_framework(checkpoint, "sklearn", cls.__name__)
        return cls(load_estimator(checkpoint), preprocessor=load_preprocessor(checkpoint), **kwargs)

    def predict(
        self,
        data: Any,
        feature_columns: list[str] | list[int] | None = None,
        num_estimator_cpus: int | None = 1,
        **predict_kwargs: Any,
    ) -> Any:
        """``num_estimator_cpus``: set every ``n_jobs``/``thread_count`` of the estimator to
        this first (None leaves them), as Ray did; ``predict_kwargs`` go to the estimator's
        ``predict`` (``keep_columns=`` is phalanx's, as on every predictor)."""
        return super().predict(
            data,
            feature_columns=feature_columns,
            num_estimator_cpus=num_estimator_cpus,
            **predict_kwargs,
        )

    def _predict_pandas(self, data: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
        return self._predictions(as_features(data), **kwargs)

    def _predict_numpy(
        self, data: np.ndarray | dict[str, np.ndarray], **kwargs: Any
    ) -> dict[str, np.ndarray]:
        frame = self._predictions(as_features(data), **kwargs)
        return {str(c): frame[c].to_numpy() for c in frame.columns}

    def _predictions(
        self, features: object, num_estimator_cpus: int | None = 1, **kwargs: Any
    ) -> pd.DataFrame:
        if num_estimator_cpus:
            set_cpu_params(self.estimator, num_estimator_cpus)
        return prediction_columns(np.asarray(self.estimator.predict(features, **kwargs)))

    def __repr__(self) -> str:
        return (
            f"SklearnPredictor(estimator={self.estimator!r}, preprocessor={self._preprocessor!r})"
        )

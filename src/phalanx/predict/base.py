"""The ``Predictor`` base: a model loaded from a checkpoint, applied to batches.

``predict(data)`` takes a pandas DataFrame or a dict of numpy arrays and returns the same kind:
the checkpoint's preprocessor is applied to the raw input, the feature columns are picked, the
model runs (``_predict_numpy`` or ``_predict_pandas``), and ``keep_columns`` of the raw input are
carried over next to the predictions.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
import pandas as pd

from phalanx.checkpoint import Checkpoint

__all__ = [
    "PREPROCESSOR_FILENAME",
    "Predictor",
    "PredictorNotSerializableError",
    "checkpoint_framework",
    "load_preprocessor",
]

PREPROCESSOR_FILENAME = "preprocessor.pkl"
FRAMEWORK_KEY = "framework"
# Which framework a checkpoint holds, told by its model file when no metadata says it.
FRAMEWORK_FILES = {
    "torch": ("model.pt",),
    "xgboost": ("model.ubj", "model.json"),
    "lightgbm": ("model.txt",),
}
DISPLAY = {"torch": "PyTorch", "xgboost": "XGBoost", "lightgbm": "LightGBM"}


class PredictorNotSerializableError(RuntimeError):
    """A Predictor was pickled; it holds a live model. Pickle its checkpoint instead."""


def checkpoint_framework(checkpoint: Checkpoint) -> str | None:
    """``"torch"``, ``"xgboost"``, ``"lightgbm"`` (from the metadata's ``framework`` or the
    model file it holds), or None if unknown."""
    try:
        framework = checkpoint.get_metadata().get(FRAMEWORK_KEY)
    except Exception:  # no metadata file
        framework = None
    if framework:
        return str(framework)
    with checkpoint.as_directory() as directory:
        names = set(os.listdir(directory))
    for name, files in FRAMEWORK_FILES.items():
        if names.intersection(files):
            return name
    return None


def check_framework(checkpoint: Checkpoint, expected: str, predictor: str) -> None:
    """Raise ValueError if ``checkpoint`` holds another framework's model."""
    found = checkpoint_framework(checkpoint)
    if found is not None and found != expected:
        raise ValueError(
            f"{predictor} cannot load {checkpoint!r}: this checkpoint holds a "
            f"{DISPLAY.get(found, found)} model, not {DISPLAY[expected]}.\n"
            f"HINT: use the predictor of the framework that trained it, e.g. "
            f"{DISPLAY.get(found, found).replace('PyTorch', 'Torch')}Predictor."
        )


def load_preprocessor(checkpoint: Checkpoint) -> Any:
    """The preprocessor saved in ``checkpoint`` (``preprocessor.pkl``), or None."""
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, PREPROCESSOR_FILENAME)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return pickle.load(f)


class Predictor:
    """Loads a trained model and predicts on batches (Ray AIR's ``ray.train.predictor``).

    Example::

        predictor = TorchPredictor.from_checkpoint(result.checkpoint, model=MyModel())
        predictions = predictor.predict(df, feature_columns=["x"])  # DataFrame in, out
    """

    #: the batch format BatchPredictor reads for this predictor
    batch_format = "pandas"

    def __init__(self, preprocessor: Any = None) -> None:
        self._preprocessor = preprocessor

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, **kwargs: Any) -> Predictor:
        raise NotImplementedError

    def get_preprocessor(self) -> Any:
        return self._preprocessor

    def set_preprocessor(self, preprocessor: Any) -> None:
        self._preprocessor = preprocessor

    def predict(
        self,
        data: Any,
        *,
        feature_columns: list[str] | None = None,
        keep_columns: list[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Predictions for ``data`` (a pandas DataFrame or a dict of numpy arrays), returned as
        the same kind: a ``predictions`` column (or one column per model output) plus
        ``keep_columns`` of the raw input."""
        is_pandas = isinstance(data, pd.DataFrame)
        if not is_pandas and not isinstance(data, dict):
            raise TypeError(
                f"predict got a {type(data).__name__}; it takes a pandas DataFrame or a dict "
                "of numpy arrays."
            )
        _require(data, keep_columns or [], "keep_columns")
        batch = data
        if self._preprocessor is not None:
            batch = self._preprocessor.transform_batch(batch)
        if feature_columns is not None:
            _require(batch, feature_columns, "feature_columns")
            batch = batch[feature_columns] if is_pandas else {c: batch[c] for c in feature_columns}
        out = self._run(batch, is_pandas, **kwargs)
        for c in keep_columns or []:
            out[c] = data[c].to_numpy() if is_pandas else data[c]
        return _to_pandas(out) if is_pandas else out

    def _run(self, batch: Any, is_pandas: bool, **kwargs: Any) -> dict[str, np.ndarray]:
        if type(self)._predict_numpy is not Predictor._predict_numpy:
            arrays = _pandas_to_numpy(batch) if is_pandas else batch
            return dict(self._predict_numpy(arrays, **kwargs))
        frame = batch if is_pandas else _to_pandas(batch)
        result = self._predict_pandas(frame, **kwargs)
        return {str(c): result[c].to_numpy() for c in result.columns}

    def _predict_numpy(self, data: dict[str, np.ndarray], **kwargs: Any) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _predict_pandas(self, data: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
        raise NotImplementedError

    def __reduce__(self) -> Any:
        raise PredictorNotSerializableError(
            f"{type(self).__name__} is not serializable: it holds a loaded model.\n"
            "HINT: pass the checkpoint and the predictor class instead (BatchPredictor does), "
            "and build the predictor with from_checkpoint where it runs."
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(preprocessor={self._preprocessor!r})"


def _require(data: Any, columns: list[str], what: str) -> None:
    have = [str(c) for c in (data.columns if isinstance(data, pd.DataFrame) else data)]
    missing = [c for c in columns if c not in have]
    if missing:
        raise ValueError(
            f"{what} names column(s) {missing} that the data lacks (it has {have}"
            f"{' after preprocessing' if what == 'feature_columns' else ''}).\n"
            "HINT: check the column names, and what the checkpoint's preprocessor outputs."
        )


def _pandas_to_numpy(df: pd.DataFrame) -> dict[str, np.ndarray]:
    out = {}
    for c in df.columns:
        values = df[c].to_numpy()
        if values.dtype == object and len(values) and isinstance(values[0], np.ndarray | list):
            values = np.stack([np.asarray(v) for v in values])
        out[str(c)] = values
    return out


def _to_pandas(arrays: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame({k: (list(v) if np.ndim(v) > 1 else v) for k, v in arrays.items()})

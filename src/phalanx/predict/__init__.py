"""phalanx.predict: Predictors (a checkpoint -> predictions) and BatchPredictor (at scale).

::

    from phalanx.predict import BatchPredictor, TorchPredictor

    predictor = TorchPredictor.from_checkpoint(result.checkpoint, model=Net())
    predictor.predict(df)  # DataFrame in, DataFrame out
    BatchPredictor.from_checkpoint(result.checkpoint, TorchPredictor, model=Net()).predict(
        "data/", num_workers=2, keep_columns=["id"], output_path="preds/"
    )

Framework predictors live in their framework packages (``phalanx.torch.TorchPredictor``, ...)
and are imported from there on first use, so ``import phalanx.predict`` imports no torch,
xgboost or lightgbm.
"""

from __future__ import annotations

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra("phalanx.predict", "numpy", "pyarrow", "pandas"):
    raise _missing

import typing as _typing

from phalanx.predict._base import Predictor, PredictorNotSerializableError, checkpoint_framework
from phalanx.predict._batch import BatchPredictor

if _typing.TYPE_CHECKING:
    from phalanx.lightgbm import LightGBMPredictor
    from phalanx.sklearn import SklearnPredictor
    from phalanx.torch import TorchPredictor
    from phalanx.xgboost import XGBoostPredictor

PredictorNotSerializableException = PredictorNotSerializableError  # Ray's name

# Each framework package owns its predictor; these names stay here for AIR-era imports.
_LAZY = {
    "TorchPredictor": "phalanx.torch",
    "XGBoostPredictor": "phalanx.xgboost",
    "LightGBMPredictor": "phalanx.lightgbm",
    "SklearnPredictor": "phalanx.sklearn",
}

__all__ = [
    "BatchPredictor",
    "LightGBMPredictor",
    "Predictor",
    "PredictorNotSerializableError",
    "PredictorNotSerializableException",
    "SklearnPredictor",
    "TorchPredictor",
    "XGBoostPredictor",
    "checkpoint_framework",
]


def __getattr__(name: str) -> _typing.Any:  # a lazily imported class of any framework
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'phalanx.predict' has no attribute {name!r}")

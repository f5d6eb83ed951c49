"""phalanx.sklearn: scikit-learn estimators as a trainer (AIR's ``ray.train.sklearn``).

``SklearnTrainer`` fits one estimator in one worker with the trainer's CPUs, scores it on every
other dataset, cross-validates it, and saves a ``SklearnCheckpoint`` (``from_estimator`` /
``get_estimator``); ``SklearnPredictor`` scores batches with it, in ``BatchPredictor`` and
``phalanx serve --predictor sklearn`` too.
"""

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra(
    "phalanx.sklearn", "sklearn", "numpy", "pandas", "pyarrow", extra="sklearn"
):
    raise _missing

from phalanx.sklearn._checkpoint import SklearnCheckpoint
from phalanx.sklearn._predictor import SklearnPredictor
from phalanx.sklearn._trainer import SklearnTrainer

__all__ = ["SklearnCheckpoint", "SklearnPredictor", "SklearnTrainer"]

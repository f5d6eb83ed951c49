"""XGBoostCheckpoint: a Checkpoint holding an ``xgboost.Booster`` (Ray's ``XGBoostCheckpoint``)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import xgboost

from phalanx.checkpoint import Checkpoint

__all__ = ["XGBoostCheckpoint"]


class XGBoostCheckpoint(Checkpoint):
    """A :class:`~phalanx.Checkpoint` with a booster in ``model.json`` (Ray's layout); a
    checkpoint saved by the trainer or ``RayTrainReportCallback`` (``model.ubj``) loads too.

    Example::

        checkpoint = XGBoostCheckpoint.from_model(booster, preprocessor=scaler)
        XGBoostCheckpoint.from_checkpoint(result.checkpoint).get_model().predict(dmatrix)
    """

    MODEL_FILENAME = "model.json"
    # Other names the booster may have: the callback's and trainer's default first.
    OTHER_FILENAMES = ("model.ubj",)

    @classmethod
    def from_model(
        cls, booster: xgboost.Booster, *, preprocessor: Any = None, path: str | None = None
    ) -> XGBoostCheckpoint:
        """A checkpoint of ``booster`` in directory ``path`` (a new temporary one if None)."""
        directory = path if path is not None else tempfile.mkdtemp(prefix="phalanx_xgboost_")
        os.makedirs(directory, exist_ok=True)
        booster.save_model(os.path.join(directory, cls.MODEL_FILENAME))
        checkpoint = cls.from_directory(directory)
        if preprocessor is not None:
            checkpoint.set_preprocessor(preprocessor)
        return checkpoint  # type: ignore[return-value]

    def get_model(self) -> xgboost.Booster:
        """The booster saved in this checkpoint."""
        booster = xgboost.Booster()
        with self.as_directory() as directory:
            booster.load_model(_model_path(self, directory))
        return booster


def _model_path(checkpoint: XGBoostCheckpoint, directory: str) -> str:
    names = (checkpoint.MODEL_FILENAME, *checkpoint.OTHER_FILENAMES)
    for name in names:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(
        f"{checkpoint!r} holds none of {list(names)}, so it holds no XGBoost model.\n"
        "HINT: use a checkpoint saved by XGBoostTrainer, RayTrainReportCallback or "
        "XGBoostCheckpoint.from_model."
    )

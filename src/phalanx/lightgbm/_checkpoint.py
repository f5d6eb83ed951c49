"""LightGBMCheckpoint: a Checkpoint holding a ``lightgbm.Booster`` (Ray's ``LightGBMCheckpoint``)."""

from __future__ import annotations

from phalanx._gbdt.checkpoint import BoosterCheckpoint
from phalanx.lightgbm._library import LIGHTGBM

__all__ = ["LightGBMCheckpoint"]


class LightGBMCheckpoint(BoosterCheckpoint):
    """A :class:`~phalanx.Checkpoint` with a booster in ``model.txt`` (Ray's layout, also what
    the trainer and ``RayTrainReportCallback`` save).

    Example::

        checkpoint = LightGBMCheckpoint.from_model(booster, preprocessor=scaler)
        LightGBMCheckpoint.from_checkpoint(result.checkpoint).get_model().predict(df)
    """

    _library = LIGHTGBM
    MODEL_FILENAME = LIGHTGBM.model_file

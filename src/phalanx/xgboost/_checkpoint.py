"""XGBoostCheckpoint: a Checkpoint holding an ``xgboost.Booster`` (Ray's ``XGBoostCheckpoint``)."""

from __future__ import annotations

from phalanx._gbdt.checkpoint import BoosterCheckpoint
from phalanx.xgboost._library import XGBOOST

__all__ = ["XGBoostCheckpoint"]


class XGBoostCheckpoint(BoosterCheckpoint):
    """A :class:`~phalanx.Checkpoint` with a booster in ``model.json`` (Ray's layout); a
    checkpoint saved by the trainer or ``RayTrainReportCallback`` (``model.ubj``) loads too.

    Example::

        checkpoint = XGBoostCheckpoint.from_model(booster, preprocessor=scaler)
        XGBoostCheckpoint.from_checkpoint(result.checkpoint).get_model().predict(dmatrix)
    """

    _library = XGBOOST
    MODEL_FILENAME = "model.json"

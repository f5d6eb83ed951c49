"""LightGBMCheckpoint: a Checkpoint holding a ``lightgbm.Booster`` (Ray's ``LightGBMCheckpoint``)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import lightgbm

from phalanx.checkpoint import Checkpoint

__all__ = ["LightGBMCheckpoint"]


class LightGBMCheckpoint(Checkpoint):
    """A :class:`~phalanx.Checkpoint` with a booster in ``model.txt`` (Ray's layout, also what
    the trainer and ``RayTrainReportCallback`` save).

    Example::

        checkpoint = LightGBMCheckpoint.from_model(booster, preprocessor=scaler)
        LightGBMCheckpoint.from_checkpoint(result.checkpoint).get_model().predict(df)
    """

    MODEL_FILENAME = "model.txt"

    @classmethod
    def from_model(
        cls, booster: lightgbm.Booster, *, preprocessor: Any = None, path: str | None = None
    ) -> LightGBMCheckpoint:
        """A checkpoint of ``booster`` in directory ``path`` (a new temporary one if None)."""
        directory = path if path is not None else tempfile.mkdtemp(prefix="phalanx_lightgbm_")
        os.makedirs(directory, exist_ok=True)
        booster.save_model(os.path.join(directory, cls.MODEL_FILENAME))
        checkpoint = cls.from_directory(directory)
        if preprocessor is not None:
            checkpoint.set_preprocessor(preprocessor)
        return checkpoint  # type: ignore[return-value]

    def get_model(self) -> lightgbm.Booster:
        """The booster saved in this checkpoint."""
        with self.as_directory() as directory:
            path = os.path.join(directory, self.MODEL_FILENAME)
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{self!r} has no {self.MODEL_FILENAME}, so it holds no LightGBM model.\n"
                    "HINT: use a checkpoint saved by LightGBMTrainer, RayTrainReportCallback "
                    "or LightGBMCheckpoint.from_model."
                )
            return lightgbm.Booster(model_file=path)

"""Constants a Ray Train script imports (``ray.train.constants``)."""

from __future__ import annotations

__all__ = ["TRAIN_DATASET_KEY"]

TRAIN_DATASET_KEY = "train"
"""The ``datasets`` key preprocessors are fitted on and GBDT trainers train on."""

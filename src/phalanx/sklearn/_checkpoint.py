"""SklearnCheckpoint: a Checkpoint holding a scikit-learn estimator (Ray's ``SklearnCheckpoint``)."""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, ClassVar, TypeVar, cast

import cloudpickle

from phalanx._foundation.checkpoint_files import find_model_file
from phalanx.checkpoint import Checkpoint

if TYPE_CHECKING:
    from sklearn.base import BaseEstimator

__all__ = ["SklearnCheckpoint", "load_estimator"]

SelfCheckpoint = TypeVar("SelfCheckpoint", bound="SklearnCheckpoint")

# AIR (Ray <= 2.6) named the pickle "model"; Ray 2.7+ "model.pkl". Both load.
LEGACY_MODEL_FILENAME = "model"
HINT = "use a checkpoint saved by SklearnTrainer or SklearnCheckpoint.from_estimator."


class SklearnCheckpoint(Checkpoint):
    """A :class:`~phalanx.Checkpoint` with an estimator pickled in ``model.pkl`` (Ray's name),
    and the preprocessor to apply before it, if any. Loading it unpickles it: load only
    checkpoints you trust.

    Example::

        from sklearn.ensemble import RandomForestClassifier
        from phalanx.sklearn import SklearnCheckpoint, SklearnPredictor

        estimator = RandomForestClassifier().fit(X, y)
        checkpoint = SklearnCheckpoint.from_estimator(estimator, path="my_model")
        SklearnPredictor.from_checkpoint(checkpoint).predict(X)
    """

    MODEL_FILENAME: ClassVar[str] = "model.pkl"

    @classmethod
    def from_estimator(
        cls: type[SelfCheckpoint],
        estimator: BaseEstimator,
        *,
        path: str | os.PathLike[str] | None = None,
        preprocessor: object = None,
    ) -> SelfCheckpoint:
        """A checkpoint of ``estimator`` in directory ``path`` (a new temporary one if None;
        Ray's AIR required it)."""
        directory = (
            os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="phalanx_sklearn_")
        )
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, cls.MODEL_FILENAME), "wb") as f:
            cloudpickle.dump(estimator, f)
        checkpoint = cls.from_directory(directory)
        if preprocessor is not None:
            checkpoint.set_preprocessor(preprocessor)
        return cast(SelfCheckpoint, checkpoint)

    def get_estimator(self) -> BaseEstimator:
        """The estimator saved in this checkpoint."""
        return load_estimator(self)

    def get_model(self) -> BaseEstimator:
        """The estimator saved in this checkpoint (the name the other framework checkpoints
        use)."""
        return load_estimator(self)


def load_estimator(checkpoint: Checkpoint) -> BaseEstimator:
    """The estimator pickled in ``checkpoint`` (FileNotFoundError with a HINT if none)."""
    with checkpoint.as_directory() as directory:
        names = (SklearnCheckpoint.MODEL_FILENAME, LEGACY_MODEL_FILENAME)
        path = find_model_file(checkpoint, directory, names, HINT)
        if os.path.isdir(path):  # a directory named "model" is some other framework's
            raise FileNotFoundError(
                f"{checkpoint!r} holds no {SklearnCheckpoint.MODEL_FILENAME}.\nHINT: {HINT}"
            )
        with open(path, "rb") as f:
            return cloudpickle.load(f)

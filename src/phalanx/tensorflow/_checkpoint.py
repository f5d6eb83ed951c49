"""TensorflowCheckpoint: a Checkpoint holding a Keras model (Ray Train's layout)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from phalanx.checkpoint import Checkpoint

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["TensorflowCheckpoint"]


class TensorflowCheckpoint(Checkpoint):
    """A :class:`~phalanx.Checkpoint` with a Keras model; its metadata key ``_model_filename``
    names the file (``model.keras``, an ``.h5`` file, or ``.`` for a SavedModel directory), as in
    Ray, so checkpoints move between Ray and phalanx.

    Example::

        checkpoint = TensorflowCheckpoint.from_model(model)
        phalanx.report({"loss": loss}, checkpoint=checkpoint)
        ...
        model = TensorflowCheckpoint.from_checkpoint(result.checkpoint).get_model()
    """

    MODEL_FILENAME_KEY = "_model_filename"

    @classmethod
    def from_model(
        cls, model: tf.keras.Model, *, preprocessor: object = None
    ) -> TensorflowCheckpoint:
        """A new checkpoint (in a temporary directory) with ``model`` saved as ``model.keras``
        (architecture, weights and optimizer state)."""

        def save(d: str) -> None:
            model.save(os.path.join(d, "model.keras"))

        return cls._new(save, "model.keras", preprocessor)

    @classmethod
    def from_h5(cls, file_path: str, *, preprocessor: object = None) -> TensorflowCheckpoint:
        """A new checkpoint with a copy of the Keras ``.h5`` file ``file_path``."""
        if not os.path.isfile(file_path) or not file_path.endswith(".h5"):
            raise ValueError(
                f"TensorflowCheckpoint.from_h5({file_path!r}): not an existing .h5 file.\n"
                "HINT: pass the path given to model.save(path) with a path ending in .h5."
            )
        name = os.path.basename(file_path)
        return cls._new(lambda d: shutil.copy(file_path, os.path.join(d, name)), name, preprocessor)

    @classmethod
    def from_saved_model(
        cls, dir_path: str, *, preprocessor: object = None
    ) -> TensorflowCheckpoint:
        """A new checkpoint with a copy of the SavedModel directory ``dir_path``."""
        if not os.path.isdir(dir_path):
            raise ValueError(
                f"TensorflowCheckpoint.from_saved_model({dir_path!r}): not a directory.\n"
                "HINT: pass the directory given to model.save(dir) or tf.saved_model.save."
            )

        def copy(d: str) -> None:
            shutil.copytree(dir_path, d, dirs_exist_ok=True)

        return cls._new(copy, ".", preprocessor)

    @classmethod
    def _new(
        cls, write: Callable[[str], object], filename: str, preprocessor: object
    ) -> TensorflowCheckpoint:
        directory = tempfile.mkdtemp(prefix="phalanx_tf_checkpoint_")
        write(directory)
        checkpoint = cls(os.path.abspath(directory))
        if preprocessor is not None:
            checkpoint.set_preprocessor(preprocessor)
        checkpoint.update_metadata({cls.MODEL_FILENAME_KEY: filename, "framework": "tensorflow"})
        return checkpoint

    def get_model(self) -> tf.keras.Model:
        """The Keras model stored in this checkpoint (``tf.keras.models.load_model``)."""
        filename = self.get_metadata().get(self.MODEL_FILENAME_KEY)
        if filename is None:
            raise ValueError(
                f"{self!r} has no {self.MODEL_FILENAME_KEY!r} in its metadata, so the model file "
                "is unknown.\nHINT: make it with TensorflowCheckpoint.from_model (or from_h5, "
                "from_saved_model), and add metadata with update_metadata, not set_metadata."
            )
        import tensorflow as tf

        with self.as_directory() as directory:
            return tf.keras.models.load_model(os.path.join(directory, filename))

"""The base of ``XGBoostCheckpoint`` and ``LightGBMCheckpoint``: a Checkpoint holding one
booster in its library's model file."""

from __future__ import annotations

import os
import tempfile
from typing import Any, ClassVar, Protocol, TypeVar, cast

from phalanx._foundation.checkpoint_files import MODEL_FILES, find_model_file
from phalanx._gbdt.library import BoostingLibrary
from phalanx.checkpoint import Checkpoint

__all__ = ["BoosterCheckpoint"]


SelfCheckpoint = TypeVar("SelfCheckpoint", bound="BoosterCheckpoint")


class SavesModel(Protocol):
    """A booster: it saves itself to a file."""

    def save_model(self, fname: str) -> object: ...


class BoosterCheckpoint(Checkpoint):
    """A :class:`~phalanx.Checkpoint` with a booster in ``MODEL_FILENAME`` (Ray's name); a
    checkpoint saved under another of the library's names (the trainer's) loads too.
    Subclasses set ``_library``."""

    _library: ClassVar[BoostingLibrary[Any]]  # the subclass's library, with its own model type
    MODEL_FILENAME: ClassVar[str]

    @classmethod
    def from_model(
        cls: type[SelfCheckpoint],
        booster: SavesModel,
        *,
        preprocessor: object = None,
        path: str | None = None,
    ) -> SelfCheckpoint:
        """A checkpoint of ``booster`` in directory ``path`` (a new temporary one if None)."""
        framework = cls._library.framework
        directory = path if path is not None else tempfile.mkdtemp(prefix=f"phalanx_{framework}_")
        os.makedirs(directory, exist_ok=True)
        booster.save_model(os.path.join(directory, cls.MODEL_FILENAME))
        checkpoint = cls.from_directory(directory)
        if preprocessor is not None:
            checkpoint.set_preprocessor(preprocessor)
        return cast(SelfCheckpoint, checkpoint)

    def get_model(self) -> Any:  # the library's model type; subclasses narrow it
        """The booster saved in this checkpoint."""
        library = self._library
        others = MODEL_FILES.get(library.framework, ())
        names = tuple(dict.fromkeys((self.MODEL_FILENAME, library.model_file, *others)))
        with self.as_directory() as directory:
            path = find_model_file(self, directory, names, self._hint())
            return library.load_model(path)

    @classmethod
    def _hint(cls) -> str:
        name = cls._library.name
        return (
            f"it holds no {name} model: use a checkpoint saved by {cls._library.trainer}, "
            f"RayTrainReportCallback or {cls.__name__}.from_model."
        )

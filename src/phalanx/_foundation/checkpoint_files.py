"""The file layout of a framework checkpoint, in one place (DESIGN §2).

A checkpoint directory holds the user's files plus, where a trainer or a framework checkpoint
class wrote them: the model file of its framework (:data:`MODEL_FILES`), the preprocessor
(:data:`PREPROCESSOR_FILE`) and the metadata's ``framework`` key (:data:`FRAMEWORK_KEY`).
Framework packages name their files from here, and predictors read checkpoints through here;
nothing in this module imports a framework, so telling which framework a checkpoint holds
never imports torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpoint

__all__ = [
    "FRAMEWORK_KEY",
    "MODEL_FILES",
    "PREPROCESSOR_FILE",
    "check_framework",
    "find_model_file",
    "framework_of",
    "load_preprocessor",
]

PREPROCESSOR_FILE = "preprocessor.pkl"
# Where Ray's FrameworkCheckpoint.set_preprocessor keeps it: the pickle, hex-encoded, in metadata.
RAY_PREPROCESSOR_KEY = "preprocessor_pkl"
FRAMEWORK_KEY = "framework"
# Each framework's model file names, the name it writes first. They also tell which framework a
# checkpoint holds when no metadata says it.
MODEL_FILES: dict[str, tuple[str, ...]] = {
    "torch": ("model.pt",),
    "xgboost": ("model.ubj", "model.json"),
    "lightgbm": ("model.txt",),
    "sklearn": ("model.pkl",),
}
DISPLAY = {"torch": "PyTorch", "xgboost": "XGBoost", "lightgbm": "LightGBM", "sklearn": "Sklearn"}


def framework_of(checkpoint: Checkpoint) -> str | None:
    """``"torch"``, ``"xgboost"``, ``"lightgbm"``, ... (the metadata's ``framework``, else told
    by the model file it holds), or None if unknown."""
    try:
        framework = checkpoint.get_metadata().get(FRAMEWORK_KEY)
    except Exception:  # no metadata file
        framework = None
    if framework:
        return str(framework)
    with checkpoint.as_directory() as directory:
        names = set(os.listdir(directory))
    for name, files in MODEL_FILES.items():
        if names.intersection(files):
            return name
    return None


def check_framework(checkpoint: Checkpoint, expected: str, predictor: str) -> None:
    """Raise ValueError if ``checkpoint`` holds another framework's model."""
    found = framework_of(checkpoint)
    if found is not None and found != expected:
        raise ValueError(
            f"{predictor} cannot load {checkpoint!r}: this checkpoint holds a "
            f"{DISPLAY.get(found, found)} model, not {DISPLAY[expected]}.\n"
            f"HINT: use the predictor of the framework that trained it, e.g. "
            f"{DISPLAY.get(found, found).replace('PyTorch', 'Torch')}Predictor."
        )


def find_model_file(
    checkpoint: Checkpoint, directory: str, names: tuple[str, ...], hint: str
) -> str:
    """The path of the first of ``names`` present in ``directory`` (``checkpoint``'s local
    copy); FileNotFoundError naming them, with ``hint``, when there is none."""
    for name in names:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{checkpoint!r} holds none of {list(names)}.\nHINT: {hint}")


def load_preprocessor(checkpoint: Checkpoint | None) -> Any:
    """The preprocessor saved in ``checkpoint`` (``preprocessor.pkl``), or None."""
    return None if checkpoint is None else checkpoint.get_preprocessor()

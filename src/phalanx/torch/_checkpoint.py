"""TorchCheckpoint: a Checkpoint holding a model's state dict (or a whole pickled model)."""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from phalanx._foundation.checkpoint_files import MODEL_FILES
from phalanx.checkpoint import Checkpoint

__all__ = ["TorchCheckpoint"]

MODEL_FILENAME = MODEL_FILES["torch"][0]


class TorchCheckpoint(Checkpoint):
    """A :class:`~phalanx.Checkpoint` with a torch model in ``model.pt`` (Ray Train's layout).

    Example::

        checkpoint = TorchCheckpoint.from_state_dict(model.state_dict())
        phalanx.report({"loss": loss}, checkpoint=checkpoint)
        ...
        model = TorchCheckpoint(result.checkpoint.path).get_model(MyModel())
    """

    MODEL_FILENAME = MODEL_FILENAME

    @classmethod
    def from_state_dict(
        cls, state_dict: Mapping[str, object], *, preprocessor: object = None
    ) -> TorchCheckpoint:
        """A new checkpoint (in a temporary directory) holding ``state_dict``.

        A ``module.`` prefix left by DistributedDataParallel is removed, so the state dict loads
        into the plain model.
        """
        state = OrderedDict(state_dict)  # a copy: the caller's dict is left as it was
        metadata = getattr(state_dict, "_metadata", None)
        if metadata is not None:  # per-module versions, used by load_state_dict
            state._metadata = OrderedDict(metadata)  # type: ignore[attr-defined]
        consume_prefix_in_state_dict_if_present(state, "module.")
        return cls._save(state, preprocessor)

    @classmethod
    def from_model(cls, model: torch.nn.Module, *, preprocessor: object = None) -> TorchCheckpoint:
        """A new checkpoint holding the whole pickled ``model``. Prefer :meth:`from_state_dict`:
        loading a pickled model runs code from the checkpoint, so only load trusted ones.

        A model wrapped by ``prepare_model`` (DistributedDataParallel, DataParallel) is saved
        unwrapped, as AIR did: the wrapper holds a process group and cannot be loaded outside
        the training workers, so ``get_model()`` returns the plain module."""
        return cls._save(_unwrapped(model), preprocessor)

    @classmethod
    def _save(cls, obj: object, preprocessor: object) -> TorchCheckpoint:
        directory = tempfile.mkdtemp(prefix="phalanx_torch_checkpoint_")
        torch.save(obj, os.path.join(directory, MODEL_FILENAME))
        checkpoint = cls(directory)
        if preprocessor is not None:
            checkpoint.set_preprocessor(preprocessor)  # cloudpickled: lambdas in it are fine
        return checkpoint

    def get_model(
        self, model: torch.nn.Module | None = None, *, weights_only: bool | None = None
    ) -> torch.nn.Module:
        """The stored model: a state dict is loaded into ``model``; a pickled model is returned
        as is (``model`` is then ignored).

        ``weights_only`` goes to ``torch.load``; ``None`` keeps torch's own default (True since
        torch 2.6: tensors and plain containers only, no code runs). A whole pickled model
        (:meth:`from_model`) needs ``weights_only=False``, which runs code from the checkpoint:
        pass it only for checkpoints you trust. (Ray Train always loads with
        ``weights_only=False``.)"""
        with self.as_directory() as directory:
            path = os.path.join(directory, MODEL_FILENAME)
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{self!r} has no {MODEL_FILENAME}.\nHINT: create it with "
                    "TorchCheckpoint.from_state_dict(...) or TorchCheckpoint.from_model(...)."
                )
            saved = _load(path, weights_only)
        if isinstance(saved, torch.nn.Module):
            if model is not None:
                warnings.warn(
                    "This TorchCheckpoint holds a whole model; the `model` argument is ignored.",
                    stacklevel=2,
                )
            return saved
        if model is None:
            raise ValueError(
                "This TorchCheckpoint holds a state dict; pass the model to load it into: "
                "checkpoint.get_model(MyModel())."
            )
        model.load_state_dict(saved)
        return model


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model


def _load(path: str, weights_only: bool | None) -> Any:
    options = {} if weights_only is None else {"weights_only": weights_only}
    try:
        return torch.load(path, map_location="cpu", **options)
    except pickle.UnpicklingError as exc:
        if weights_only is False:
            raise
        raise pickle.UnpicklingError(
            f"{path} cannot be loaded with weights_only=True (torch's default): it holds more "
            "than tensors, e.g. a whole pickled model (TorchCheckpoint.from_model), and loading "
            "that runs code stored in the checkpoint.\nHINT: if you trust where this checkpoint "
            "came from, call TorchCheckpoint(path).get_model(weights_only=False) (and pass that "
            "model to TorchPredictor(model)); otherwise save state dicts "
            f"(TorchCheckpoint.from_state_dict).\ntorch said: {exc}"
        ) from exc

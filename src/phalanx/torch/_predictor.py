"""TorchPredictor: a torch module in eval mode under ``no_grad``, batches as tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from phalanx._foundation.checkpoint_files import check_framework, load_preprocessor
from phalanx.checkpoint import Checkpoint
from phalanx.predict._base import Predictor

__all__ = ["TorchPredictor"]


class TorchPredictor(Predictor):
    """Runs ``model`` on batches. One feature column -> the model gets one tensor (1-D columns
    become ``(rows, 1)``); several -> a dict of tensors. A tensor output becomes the
    ``predictions`` column; a dict or tuple of tensors one column each.

    Example::

        predictor = TorchPredictor.from_checkpoint(checkpoint, model=MyModel())
        predictor.predict({"x": np.ones((4, 3), "f4")})["predictions"]
    """

    batch_format = "numpy"

    def __init__(
        self,
        model: torch.nn.Module,
        preprocessor: Any = None,
        use_gpu: bool = False,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__(preprocessor)
        if device is None:
            device = "cuda" if use_gpu else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "TorchPredictor(use_gpu=True) but torch sees no CUDA device.\n"
                "HINT: drop use_gpu, or run where a GPU is visible."
            )
        self.model = model.to(self.device).eval()

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Checkpoint,
        model: torch.nn.Module | None = None,
        use_gpu: bool = False,
        *,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> TorchPredictor:
        """``model`` receives the checkpoint's state dict; a checkpoint holding a whole pickled
        model needs none, but loading one runs code from the checkpoint, so it needs
        ``weights_only=False`` (see :meth:`TorchCheckpoint.get_model`; trusted checkpoints
        only). The checkpoint's preprocessor (if any) is applied to raw input."""
        from phalanx.torch._checkpoint import TorchCheckpoint

        check_framework(checkpoint, "torch", cls.__name__)
        loaded = TorchCheckpoint(checkpoint.path, checkpoint.filesystem).get_model(
            model, weights_only=weights_only
        )
        return cls(loaded, preprocessor=load_preprocessor(checkpoint), use_gpu=use_gpu, **kwargs)

    def predict(  # type: ignore[override]
        self,
        data: Any,
        dtype: torch.dtype | dict[str, torch.dtype] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Predictions for ``data`` (see :meth:`Predictor.predict`); ``dtype``: the torch dtype
        of the input tensors, one for all or a dict per column."""
        return super().predict(data, dtype=dtype, **kwargs)

    def call_model(self, inputs: object) -> Any:
        """Run the model; override to call it differently."""
        return self.model(inputs)

    def _predict_numpy(  # type: ignore[override]
        self, data: np.ndarray | dict[str, np.ndarray], dtype: object = None, **kwargs: object
    ) -> dict[str, np.ndarray]:
        inputs: Any
        if isinstance(data, np.ndarray):
            # A bare array keeps its shape, as AIR 2.4+'s TorchPredictor: [1, 2, 3] -> (3,).
            inputs = self._tensor(None, data, dtype, column_vector=False)
        else:
            tensors = {c: self._tensor(c, v, dtype) for c, v in data.items()}
            # One column: the model gets the tensor itself, as AIR's DLPredictor did.
            inputs = next(iter(tensors.values())) if len(tensors) == 1 else tensors
        with torch.no_grad():
            output = self.call_model(inputs)
        if isinstance(output, dict):
            return {str(k): _array(v) for k, v in output.items()}
        if isinstance(output, list | tuple):
            return {f"predictions_{i}": _array(v) for i, v in enumerate(output)}
        return {"predictions": _array(output)}

    def _tensor(
        self, column: str | None, values: np.ndarray, dtype: Any, column_vector: bool = True
    ) -> torch.Tensor:
        if isinstance(dtype, dict):
            dtype = dtype.get(column) if column is not None else None
        array = np.ascontiguousarray(values)
        if not array.flags.writeable:  # rows shared with Arrow: torch wants its own memory
            array = array.copy()
        tensor = torch.as_tensor(array, dtype=dtype, device=self.device)
        # A table column becomes a column vector (n, 1), as a model of one feature expects.
        return tensor.unsqueeze(1) if column_vector and tensor.ndim == 1 else tensor

    def __repr__(self) -> str:
        return f"TorchPredictor(model={type(self.model).__name__}, device={self.device})"


def _array(tensor: object) -> np.ndarray:
    return tensor.detach().cpu().numpy() if isinstance(tensor, torch.Tensor) else np.asarray(tensor)

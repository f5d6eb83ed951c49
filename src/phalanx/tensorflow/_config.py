"""TensorflowConfig: how ``TF_CONFIG`` is set up on the workers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.backend import Backend, BackendConfig

__all__ = ["TensorflowConfig"]


@dataclass
class TensorflowConfig(BackendConfig):
    """How the workers of a :class:`TensorflowTrainer` find each other (no options, as in Ray).

    Every rank reserves a free port (on 127.0.0.1 when all workers share a node, else on its
    node's address) and gets ``TF_CONFIG`` = ``{"cluster": {"worker": [every rank's
    host:port]}, "task": {"type": "worker", "index": rank}}``; the port is freed for
    TensorFlow right before the training function starts. ``TF_USE_LEGACY_KERAS=1`` is set
    unless the worker's environment already has it (Keras 3 does not support
    ``MultiWorkerMirroredStrategy`` in ``model.fit``; Ray sets it too).

    Example::

        TensorflowTrainer(train_func, tensorflow_config=TensorflowConfig(), ...)  # the default
    """

    @property
    def backend_cls(self) -> type[Backend]:
        from phalanx.tensorflow._backend import TensorflowBackend

        return TensorflowBackend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[object]]:
        from phalanx.tensorflow._worker_setup import TrainFuncContext

        return TrainFuncContext

    @property
    def framework(self) -> str | None:
        return "tensorflow"

    def to_dict(self) -> dict[str, object]:
        return {}

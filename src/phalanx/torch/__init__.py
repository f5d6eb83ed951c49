"""phalanx.torch: PyTorch data-parallel training; ``ray.train.torch`` with its imports changed.

Example::

    import phalanx as train
    from phalanx.torch import TorchTrainer, prepare_data_loader, prepare_model

    def train_func(config):
        model = prepare_model(build_model())
        loader = prepare_data_loader(DataLoader(dataset, batch_size=64, shuffle=True))
        for epoch in range(config["epochs"]):
            for x, y in loader:
                ...
            train.report({"epoch": epoch, "loss": loss.item()})

    TorchTrainer(train_func, train_loop_config={"epochs": 5},
                 scaling_config=train.ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

import typing as _typing

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra("phalanx.torch", "torch", "numpy", extra="torch"):
    raise _missing

from phalanx._foundation.module_aliases import keep_old_module_paths as _keep_old_paths
from phalanx.torch._amp import accelerate, backward, prepare_optimizer
from phalanx.torch._checkpoint import TorchCheckpoint
from phalanx.torch._config import TorchConfig
from phalanx.torch._data_loader import prepare_data_loader
from phalanx.torch._devices import get_device, get_devices
from phalanx.torch._model import enable_reproducibility, prepare_model
from phalanx.torch._state import load_state, save_state
from phalanx.torch._trainer import TorchTrainer

# A TorchCheckpoint pickled before the module was renamed names this path.
_keep_old_paths(__name__, ["checkpoint"])

if _typing.TYPE_CHECKING:
    from phalanx.torch._predictor import TorchPredictor


def __getattr__(name: str) -> _typing.Any:
    # Imported on first use: predictors need pandas and pyarrow, which training does not.
    if name == "TorchPredictor":
        from phalanx.torch._predictor import TorchPredictor

        return TorchPredictor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TorchCheckpoint",
    "TorchConfig",
    "TorchPredictor",
    "TorchTrainer",
    "accelerate",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "load_state",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
    "save_state",
]

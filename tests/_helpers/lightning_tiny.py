"""A tiny Lightning module, built on the Lightning package the caller imported: the tests that
check the older ``pytorch_lightning`` name must never import ``lightning``."""

from __future__ import annotations

from types import ModuleType
from typing import Any


def linear_regressor(pl: ModuleType, momentum: float = 0.0) -> Any:
    """A ``pl.LightningModule`` class: one ``Linear(4, 1)``, MSE loss logged as ``loss``, SGD
    with lr 0.05 and ``momentum`` (non-zero: the optimizer has state to save and restore)."""
    import torch

    class LinearRegressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=momentum)

    return LinearRegressor

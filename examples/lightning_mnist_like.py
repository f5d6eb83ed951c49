"""Ray's "Get started with PyTorch Lightning" on phalanx: a small CNN on MNIST-shaped data.

Written as a Ray Train user writes it; only the imports differ (``ray.train.lightning`` ->
``phalanx.lightning``, ``ray.train.torch`` -> ``phalanx.torch``, ``from ray import train`` ->
``import phalanx as train``). The data is synthetic (random 28x28 "digits" labelled by a hidden
random teacher), so it runs anywhere, offline. Needs ``pip install "phalanx[lightning]"``.

    python examples/lightning_mnist_like.py            # 2 workers: 2 epochs, then resume to 4
    python examples/lightning_mnist_like.py --epochs 6 --storage-path /tmp/runs --name mnist

The second ``fit()`` uses the same ``RunConfig(name, storage_path)``: ``train.get_checkpoint()``
returns the first run's latest Lightning checkpoint and ``trainer.fit(ckpt_path=...)`` continues
from the next epoch. The best checkpoint by ``val_loss`` is then loaded for predictions.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import phalanx as train
from phalanx.lightning import (
    RayDDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from phalanx.torch import TorchTrainer


class ImageClassifier(pl.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, 10),
        )
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.criterion(self(x), y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", self.criterion(logits, y), sync_dist=True)
        self.log("val_accuracy", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def synthetic_mnist(rows: int, seed: int) -> TensorDataset:
    """Images shaped like MNIST's, normalised, labelled by a fixed random linear teacher."""
    images = (
        torch.rand(rows, 1, 28, 28, generator=torch.Generator().manual_seed(seed)) - 0.5
    ) / 0.5
    teacher = torch.randn(28 * 28, 10, generator=torch.Generator().manual_seed(1234))
    return TensorDataset(images, (images.flatten(1) @ teacher).argmax(dim=1))


def train_func(config: dict[str, Any]) -> None:
    train_loader = DataLoader(synthetic_mnist(config["rows"], 0), batch_size=64, shuffle=True)
    val_loader = DataLoader(synthetic_mnist(config["rows"] // 4, 1), batch_size=256)

    # [1] Configure the Lightning Trainer, as Ray's guide does.
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False,  # RayTrainReportCallback saves a checkpoint every epoch
        logger=False,
        default_root_dir=tempfile.gettempdir(),
    )
    trainer = prepare_trainer(trainer)

    # [2] Resume from the latest checkpoint of this run, if there is one.
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            ckpt_path = os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(ImageClassifier(), train_loader, val_loader, ckpt_path=ckpt_path)
    else:
        trainer.fit(ImageClassifier(), train_loader, val_loader)


def fit(args: argparse.Namespace, epochs: int) -> train.Result:
    # [3] Scale and launch: one Lightning process per worker.
    return TorchTrainer(
        train_func,
        train_loop_config={"epochs": epochs, "rows": args.rows},
        scaling_config=train.ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=train.RunConfig(
            name=args.name,
            storage_path=args.storage_path,
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--storage-path", default=os.path.join(tempfile.gettempdir(), "phalanx"))
    parser.add_argument("--name", default="lightning_mnist_like")
    args = parser.parse_args()

    first = fit(args, epochs=max(1, args.epochs // 2))
    print("first fit:", first.metrics)
    result = fit(args, epochs=args.epochs)  # same name: resumes from the latest checkpoint
    print("resumed to:", result.metrics)
    print(result.metrics_dataframe[["epoch", "step", "loss", "val_loss", "val_accuracy"]])

    best = result.get_best_checkpoint("val_loss", "min")
    with best.as_directory() as ckpt_dir:
        model = ImageClassifier.load_from_checkpoint(
            os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME)
        )
    images, labels = synthetic_mnist(256, 1).tensors
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    print(f"best checkpoint {best.path}: accuracy {accuracy:.3f} on 256 validation images")


if __name__ == "__main__":
    main()

"""FashionMNIST-shaped MLP (784-512-512-10) with TorchTrainer, checkpoints and resume.

Written as a Ray Train user writes it; only the imports differ (``from ray import train`` ->
``import phalanx as train``, ``ray.train.torch`` -> ``phalanx.torch``). The data is synthetic
(random 28x28 "images" labelled by a hidden random teacher), so it runs anywhere, offline.

    python examples/torch_mlp.py                     # 2 workers: 2 epochs, then resume to 4
    python examples/torch_mlp.py --epochs 6 --storage-path /tmp/runs --name mlp

The script fits twice with the same ``RunConfig(name, storage_path)``: the second ``fit()`` finds
the first run's latest checkpoint (``train.get_checkpoint()``) and continues from the next epoch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import phalanx as train
from phalanx.torch import TorchTrainer, prepare_data_loader, prepare_model


class NeuralNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_relu_stack(self.flatten(x))


def synthetic_fashion_mnist(rows: int, seed: int) -> TensorDataset:
    """Images shaped like FashionMNIST's, labelled by a fixed random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(rows, 1, 28, 28, generator=g)
    images = (images - 0.5) / 0.5  # what transforms.Normalize((0.5,), (0.5,)) does
    teacher = torch.randn(28 * 28, 10, generator=torch.Generator().manual_seed(1234))
    labels = (images.flatten(1) @ teacher).argmax(dim=1)
    return TensorDataset(images, labels)


def train_func_per_worker(config: dict[str, Any]) -> None:
    lr, epochs, batch_size = config["lr"], config["epochs"], config["batch_size_per_worker"]

    # Every rank builds the same data; prepare_data_loader gives each rank its shard.
    train_loader = DataLoader(
        synthetic_fashion_mnist(config["train_rows"], seed=0), batch_size=batch_size, shuffle=True
    )
    test_loader = DataLoader(synthetic_fashion_mnist(config["test_rows"], seed=1), batch_size=256)
    train_loader = prepare_data_loader(train_loader)
    test_loader = prepare_data_loader(test_loader)

    model = prepare_model(NeuralNetwork())
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    for epoch in range(start_epoch, epochs):
        if train.get_context().get_world_size() > 1:
            # Ray Train's docs ask for this; it also makes a resumed epoch shuffle as the
            # original would have.
            train_loader.sampler.set_epoch(epoch)

        model.train()
        for x, y in train_loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        test_loss, correct, seen = 0.0, 0, 0
        with torch.no_grad():
            for x, y in test_loader:
                pred = model(x)
                test_loss += loss_fn(pred, y).item() * len(y)
                correct += (pred.argmax(1) == y).sum().item()
                seen += len(y)
        metrics = {"epoch": epoch, "loss": test_loss / seen, "accuracy": correct / seen}

        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                torch.save(
                    {
                        "epoch": epoch,
                        "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict(),
                    },
                    os.path.join(temp_checkpoint_dir, "checkpoint.pt"),
                )
                checkpoint = train.Checkpoint.from_directory(temp_checkpoint_dir)
            train.report(metrics, checkpoint=checkpoint)
        if train.get_context().get_world_rank() == 0:
            print(metrics)


def fit(args: argparse.Namespace, epochs: int) -> train.Result:
    trainer = TorchTrainer(
        train_func_per_worker,
        train_loop_config={
            "lr": 0.01,
            "epochs": epochs,
            "batch_size_per_worker": args.batch_size,
            "train_rows": args.train_rows,
            "test_rows": args.test_rows,
        },
        scaling_config=train.ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=train.RunConfig(
            name=args.name,
            storage_path=args.storage_path,
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="accuracy", checkpoint_score_order="max"
            ),
        ),
    )
    return trainer.fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--train-rows", type=int, default=12_000)
    parser.add_argument("--test-rows", type=int, default=2_000)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--storage-path", default=None, help="default: a new temporary directory")
    parser.add_argument("--name", default="torch_mlp")
    args = parser.parse_args()
    if args.storage_path is None:
        args.storage_path = tempfile.mkdtemp(prefix="phalanx_torch_mlp_")

    first = args.epochs // 2
    print(f"== fit() for epochs 0..{first - 1}")
    result = fit(args, epochs=first)
    print(f"   metrics: {result.metrics}\n   checkpoint: {result.checkpoint}")

    print(f"== fit() again, same name and storage: resumes at epoch {first}")
    result = fit(args, epochs=args.epochs)
    print(f"   metrics: {result.metrics}\n   checkpoint: {result.checkpoint}")
    print(result.metrics_dataframe[["epoch", "loss", "accuracy"]].to_string(index=False))

    best = result.get_best_checkpoint("accuracy", "max")
    model = NeuralNetwork()
    with best.as_directory() as d:
        model.load_state_dict(torch.load(os.path.join(d, "checkpoint.pt"))["model"])
    params = sum(p.numel() for p in model.parameters())
    print(f"best checkpoint: {best}, reloaded into a plain model ({params:,} parameters)")


if __name__ == "__main__":
    main()

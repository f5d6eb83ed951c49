"""Demo: train a small MLP with DDP on 2 local workers, on synthetic data, with checkpoints.

    python examples/demo.py [--workers 2] [--epochs 5] [--lr 0.05] [--name demo] [--storage DIR]

The run goes to ~/phalanx_results/demo (--storage: else $PHALANX_STORAGE_PATH, else
~/phalanx_results). Run it again with the same --name and more --epochs: it resumes from the last
checkpoint. Each checkpoint holds model.pt (the weights, what ``phalanx serve`` loads) and
state.pt (optimizer and epoch, to resume); from the repository's root:

    phalanx serve ~/phalanx_results/demo --model examples.demo:make_model
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from torch import nn

import phalanx as train
from phalanx import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from phalanx.torch import TorchTrainer, prepare_model

FEATURES, CLASSES = 8, 4


def make_data(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic classification task: labels from a hidden random linear map."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, FEATURES, generator=g)
    labels = (x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(dim=1)
    return x, labels


def make_model() -> nn.Module:
    """The MLP, untrained: `phalanx serve --model examples.demo:make_model` loads model.pt into it."""
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def train_func(config: dict) -> dict:
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = prepare_model(make_model())  # DDP
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    start_epoch = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    x, y = make_data(config["rows"])
    x, y = x[rank::world], y[rank::world]  # this rank's shard
    loss_fn = nn.CrossEntropyLoss()
    accuracy = float("nan")  # a run resumed after its last epoch trains no more
    for epoch in range(start_epoch, config["epochs"]):
        for i in range(0, len(x), config["batch_size"]):
            optimizer.zero_grad()
            loss = loss_fn(model(x[i : i + config["batch_size"]]), y[i : i + config["batch_size"]])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
                torch.save(
                    {
                        "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "epoch": epoch,
                    },
                    os.path.join(d, "state.pt"),
                )
                print(f"epoch {epoch}: loss={loss.item():.4f} accuracy={accuracy:.3f}")
            train.report(
                {"epoch": epoch, "loss": loss.item(), "accuracy": accuracy},
                checkpoint=Checkpoint.from_directory(d) if rank == 0 else None,
            )
    return {"final_accuracy": accuracy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--name", default="demo")
    parser.add_argument("--storage", help="default: $PHALANX_STORAGE_PATH or ~/phalanx_results")
    args = parser.parse_args()

    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": args.lr, "epochs": args.epochs, "rows": 20_000, "batch_size": 128},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(
            name=args.name,
            storage_path=args.storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="accuracy", checkpoint_score_order="max"
            ),
        ),
    )
    start = time.perf_counter()
    result = trainer.fit()
    print(f"\nfit() took {time.perf_counter() - start:.2f} s")
    print("metrics:         ", result.metrics)
    print("return value:    ", result.return_value)
    print("checkpoint:      ", result.checkpoint)
    print("best checkpoint: ", result.get_best_checkpoint("accuracy", "max"))
    print("run directory:   ", result.path)
    print(result.metrics_dataframe[["epoch", "loss", "accuracy"]].to_string(index=False))


if __name__ == "__main__":
    main()

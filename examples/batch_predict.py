"""Train a small torch model with a preprocessor, then score a Parquet folder to Parquet.

    python examples/batch_predict.py

Until trainers take ``preprocessor=``, the preprocessor is fitted here and saved in the
checkpoint with ``TorchCheckpoint.from_state_dict(..., preprocessor=...)``; the predictors then
apply it to the raw columns.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pandas as pd
import torch

import phalanx
from phalanx.predict import BatchPredictor, TorchPredictor
from phalanx.preprocess import Chain, Concatenator, StandardScaler
from phalanx.torch import TorchCheckpoint, TorchTrainer

FEATURES = ["a", "b"]


def make_data(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"id": np.arange(rows), "a": rng.normal(10, 4, rows)})
    df["b"] = rng.normal(-3, 2, rows)
    df["y"] = (2 * df["a"] - df["b"] + rng.normal(0, 0.1, rows)).astype(np.float32)
    return df


def train_func(config: dict) -> None:
    prep = config["preprocessor"]
    model = phalanx.torch.prepare_model(torch.nn.Linear(2, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
    for epoch in range(20):
        for batch in phalanx.get_dataset_shard("train").iter_batches(batch_size=256):
            batch = prep.transform_batch(batch)  # raw columns -> scaled "x"
            x, y = torch.tensor(batch["x"]), torch.tensor(batch["y"]).unsqueeze(1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        checkpoint = None
        if epoch == 19 and phalanx.get_context().get_world_rank() == 0:
            checkpoint = TorchCheckpoint.from_state_dict(model.state_dict(), preprocessor=prep)
        phalanx.report({"loss": loss.item()}, checkpoint=checkpoint)


def main() -> None:
    root = tempfile.mkdtemp(prefix="phalanx_batch_predict_example_")
    train = make_data(4000, seed=0)
    prep = Chain(StandardScaler(FEATURES), Concatenator(FEATURES, "x", dtype=np.float32))
    prep.fit(train)
    result = TorchTrainer(
        train_func,
        train_loop_config={"preprocessor": prep},
        scaling_config=phalanx.ScalingConfig(num_workers=2),
        run_config=phalanx.RunConfig(storage_path=root, name="train"),
        datasets={"train": train},
    ).fit()
    print(f"trained: loss={result.metrics['loss']:.4f}")

    raw = os.path.join(root, "raw")
    os.makedirs(raw)
    new = make_data(10_000, seed=1).drop(columns="y")
    for i in range(4):
        new.iloc[i * 2500 : (i + 1) * 2500].to_parquet(os.path.join(raw, f"part{i}.parquet"))
    predictor = BatchPredictor.from_checkpoint(
        result.checkpoint, TorchPredictor, model=torch.nn.Linear(2, 1)
    )
    out = os.path.join(root, "predictions")
    predictor.predict(
        raw, num_workers=2, feature_columns=["x"], keep_columns=["id"], output_path=out
    )
    scored = pd.read_parquet(out)
    print(f"scored {len(scored)} rows into {out}")
    print(scored.head())


if __name__ == "__main__":
    main()

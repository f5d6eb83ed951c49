"""Distributed LightGBM on a tabular dataset, both ways Ray Train offers, with phalanx.

Written as a Ray Train user writes it; only the imports differ (``ray.train`` -> ``phalanx``,
``ray.train.lightgbm`` -> ``phalanx.lightgbm``). The data is synthetic (a regression target from
a non-linear function of 20 features), so it runs anywhere, offline.

    python examples/lightgbm_tabular.py                # 2 workers, 100k rows, 50 rounds
    python examples/lightgbm_tabular.py --workers 4 --rows 1000000 --rounds 200

1. ``LightGBMTrainer(datasets=..., label_column=..., params=...)``: the built-in loop. Every
   round's ``train-*`` / ``valid-*`` metrics are reported, a checkpoint is kept every 10 rounds
   (a failed worker restarts the run from there), and the model is in ``result.checkpoint``.
2. ``LightGBMTrainer(train_func)``: your own loop, with ``get_network_params()`` merged into
   the params and ``RayTrainReportCallback`` reporting, stopping early on ``valid-l2``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import lightgbm
import numpy as np
import pandas as pd

import phalanx as train
from phalanx.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_network_params

PARAMS = {"objective": "regression", "metric": ["l2", "l1"], "num_leaves": 63, "learning_rate": 0.1}


def synthetic_tabular(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 20)).astype(np.float32)
    target = 3 * x[:, 0] - 2 * x[:, 1] * x[:, 2] + np.sin(3 * x[:, 3]) + rng.normal(size=rows)
    df = pd.DataFrame(x, columns=[f"x{i}" for i in range(20)])
    df["target"] = target
    return df


def train_func(config: dict) -> None:
    """Ray Train 2.60 style: each worker builds a Dataset from its shard and calls lightgbm.
    The validation set goes whole to every worker (see ``dataset_config`` below), so every
    rank computes the same metrics and stops at the same round."""
    train_df = train.get_dataset_shard("train").to_pandas()
    valid_df = train.get_dataset_shard("valid").to_pandas()
    train_set = lightgbm.Dataset(train_df.drop(columns="target"), label=train_df["target"])
    valid_set = lightgbm.Dataset(
        valid_df.drop(columns="target"), label=valid_df["target"], reference=train_set
    )
    params = {**config["params"], "tree_learner": "data", "verbosity": 0, **get_network_params()}
    callback = RayTrainReportCallback(metrics={"mse": "valid-l2"}, frequency=10)
    booster = lightgbm.train(
        params,
        train_set,
        num_boost_round=config["rounds"],
        valid_sets=[valid_set],
        valid_names=["valid"],
        callbacks=[lightgbm.early_stopping(5, verbose=False), callback],
    )
    callback.after_training(booster)  # early stopping ends the run before the last round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()
    storage = args.storage_path or tempfile.mkdtemp(prefix="phalanx-lightgbm-")
    data = synthetic_tabular(args.rows)
    split = int(len(data) * 0.8)
    datasets = {"train": data.iloc[:split], "valid": data.iloc[split:]}
    scaling = train.ScalingConfig(num_workers=args.workers)

    start = time.perf_counter()
    result = LightGBMTrainer(
        datasets=datasets,
        label_column="target",
        params=PARAMS,
        num_boost_round=args.rounds,
        scaling_config=scaling,
        run_config=train.RunConfig(
            name="lightgbm-builtin",
            storage_path=storage,
            checkpoint_config=train.CheckpointConfig(checkpoint_frequency=10, num_to_keep=2),
            failure_config=train.FailureConfig(max_failures=1),
        ),
    ).fit()
    booster = LightGBMTrainer.get_model(result.checkpoint)
    print(
        f"built-in loop: {booster.current_iteration()} rounds in "
        f"{time.perf_counter() - start:.1f} s; valid-l2 {result.metrics['valid-l2']:.4f}, "
        f"valid-l1 {result.metrics['valid-l1']:.4f}"
    )

    start = time.perf_counter()
    result = LightGBMTrainer(
        train_func,
        train_loop_config={"params": {**PARAMS, "learning_rate": 0.3}, "rounds": args.rounds * 10},
        datasets=datasets,
        dataset_config=train.DataConfig(datasets_to_split=["train"]),
        scaling_config=scaling,
        run_config=train.RunConfig(name="lightgbm-own-loop", storage_path=storage),
    ).fit()
    print(
        f"own loop: stopped early, best round {result.metrics.get('best_iteration')}, in "
        f"{time.perf_counter() - start:.1f} s; valid-l2 {result.metrics['mse']:.4f}"
    )
    print(f"runs saved under {storage}")


if __name__ == "__main__":
    main()

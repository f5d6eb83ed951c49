"""Distributed XGBoost on a tabular dataset, both ways Ray Train offers, with phalanx.

Written as a Ray Train user writes it; only the imports differ (``ray.train`` -> ``phalanx``,
``ray.train.xgboost`` -> ``phalanx.xgboost``). The data is synthetic (a binary label from a
non-linear function of 20 features), so it runs anywhere, offline.

    python examples/xgboost_tabular.py                 # 2 workers, 100k rows, 50 rounds
    python examples/xgboost_tabular.py --workers 4 --rows 1000000 --rounds 200

1. ``XGBoostTrainer(datasets=..., label_column=..., params=...)``: the built-in loop. Every
   round's ``train-*`` / ``valid-*`` metrics are reported, a checkpoint is kept every 10 rounds
   (a failed worker restarts the run from there), and the model is in ``result.checkpoint``.
2. ``XGBoostTrainer(train_func)``: your own loop on each worker's shard, reporting with
   ``RayTrainReportCallback``, stopping early when ``valid-logloss`` stops improving.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pandas as pd
import xgboost

import phalanx as train
from phalanx.xgboost import RayTrainReportCallback, XGBoostTrainer

PARAMS = {
    "objective": "binary:logistic",
    "eval_metric": ["logloss", "error"],
    "tree_method": "hist",
    "max_depth": 6,
    "eta": 0.2,
}


def synthetic_tabular(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 20)).astype(np.float32)
    logit = x[:, 0] - 2 * x[:, 1] * x[:, 2] + np.sin(3 * x[:, 3]) + rng.normal(size=rows)
    df = pd.DataFrame(x, columns=[f"x{i}" for i in range(20)])
    df["label"] = (logit > 0).astype(np.int32)
    return df


def train_func(config: dict) -> None:
    """Ray Train 2.60 style: each worker builds DMatrices from its shard and calls xgboost."""
    train_df = train.get_dataset_shard("train").to_pandas()
    valid_df = train.get_dataset_shard("valid").to_pandas()
    dtrain = xgboost.DMatrix(train_df.drop(columns="label"), label=train_df["label"])
    dvalid = xgboost.DMatrix(valid_df.drop(columns="label"), label=valid_df["label"])
    xgboost.train(
        config["params"],
        dtrain,
        num_boost_round=config["rounds"],
        evals=[(dtrain, "train"), (dvalid, "valid")],
        early_stopping_rounds=5,
        verbose_eval=False,
        callbacks=[RayTrainReportCallback(metrics={"loss": "valid-logloss"}, frequency=10)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()
    storage = args.storage_path or tempfile.mkdtemp(prefix="phalanx-xgboost-")
    data = synthetic_tabular(args.rows)
    split = int(len(data) * 0.8)
    datasets = {"train": data.iloc[:split], "valid": data.iloc[split:]}
    scaling = train.ScalingConfig(num_workers=args.workers)

    start = time.perf_counter()
    result = XGBoostTrainer(
        datasets=datasets,
        label_column="label",
        params=PARAMS,
        num_boost_round=args.rounds,
        scaling_config=scaling,
        run_config=train.RunConfig(
            name="xgboost-builtin",
            storage_path=storage,
            checkpoint_config=train.CheckpointConfig(checkpoint_frequency=10, num_to_keep=2),
            failure_config=train.FailureConfig(max_failures=1),
        ),
    ).fit()
    booster = XGBoostTrainer.get_model(result.checkpoint)
    print(
        f"built-in loop: {booster.num_boosted_rounds()} rounds in "
        f"{time.perf_counter() - start:.1f} s; valid-logloss {result.metrics['valid-logloss']:.4f}"
        f", valid-error {result.metrics['valid-error']:.4f}"
    )

    start = time.perf_counter()
    result = XGBoostTrainer(
        train_func,
        train_loop_config={"params": PARAMS, "rounds": args.rounds * 4},
        datasets=datasets,
        scaling_config=scaling,
        run_config=train.RunConfig(name="xgboost-own-loop", storage_path=storage),
    ).fit()
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    print(
        f"own loop: stopped early at round {booster.num_boosted_rounds()} (best: "
        f"{result.metrics.get('best_iteration')}) in {time.perf_counter() - start:.1f} s; "
        f"valid-logloss {result.metrics['loss']:.4f}"
    )
    print(f"runs saved under {storage}")


if __name__ == "__main__":
    main()

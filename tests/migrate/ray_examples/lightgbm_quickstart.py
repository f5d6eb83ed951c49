# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.60 docs, "Get Started with Distributed Training using LightGBM"
# (doc/source/train/doc_code/lightgbm_quickstart.py), in Ray's own form. Synthetic data: iris-like
# CSV folders instead of s3://ray-example-data/iris; 20 rounds; 1 CPU per worker (2-core CI).
import os
import tempfile

import numpy as np
import pandas as pd

DATA = tempfile.mkdtemp()
for split, rows in (("train", 150), ("val", 60)):
    rng = np.random.default_rng(len(split))
    target = rng.integers(0, 3, rows)
    frame = pd.DataFrame(rng.normal(size=(rows, 4)) + target[:, None], columns=list("abcd"))
    frame["target"] = target
    os.makedirs(f"{DATA}/{split}")
    frame.to_csv(f"{DATA}/{split}/1.csv", index=False)

import lightgbm as lgb

import ray.train
from ray.train.lightgbm import LightGBMTrainer, RayTrainReportCallback

# 1. Load your data as a Ray Data Dataset.
train_dataset = ray.data.read_csv(f"{DATA}/train")
eval_dataset = ray.data.read_csv(f"{DATA}/val")


def train_func():
    # 2. Load your data shard as a `lightgbm.Dataset`.

    # Get dataset shards for this worker
    train_shard = ray.train.get_dataset_shard("train")
    eval_shard = ray.train.get_dataset_shard("eval")

    # Convert shards to pandas DataFrames
    train_df = train_shard.materialize().to_pandas()
    eval_df = eval_shard.materialize().to_pandas()

    train_X = train_df.drop("target", axis=1)
    train_y = train_df["target"]
    eval_X = eval_df.drop("target", axis=1)
    eval_y = eval_df["target"]

    train_set = lgb.Dataset(train_X, label=train_y)
    eval_set = lgb.Dataset(eval_X, label=eval_y)

    # 3. Define your LightGBM model training parameters.
    params = {
        "objective": "multiclass",
        "num_class": 3,
        "metric": ["multi_logloss", "multi_error"],
        "verbosity": -1,
        "boosting_type": "gbdt",
        "num_leaves": 31,
        "learning_rate": 0.05,
        "feature_fraction": 0.9,
        "bagging_fraction": 0.8,
        "bagging_freq": 5,
    }

    # 4. Do distributed data-parallel training.
    model = lgb.train(
        params,
        train_set,
        valid_sets=[eval_set],
        valid_names=["eval"],
        num_boost_round=20,
        # Optional: Use the `RayTrainReportCallback` to save and report checkpoints.
        callbacks=[RayTrainReportCallback()],
    )


# 5. Configure scaling and resource requirements.
scaling_config = ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})

# 6. Launch distributed training job.
trainer = LightGBMTrainer(
    train_func,
    scaling_config=scaling_config,
    datasets={"train": train_dataset, "eval": eval_dataset},
)
result = trainer.fit()

# 7. Load the trained model.
model = RayTrainReportCallback.get_model(result.checkpoint)

assert model.current_iteration() == 20
assert "eval-multi_error" in result.metrics
print("ROUNDTRIP-OK")

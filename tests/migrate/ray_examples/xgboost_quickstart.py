# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.60 docs, "Get Started with Distributed Training using XGBoost"
# (doc/source/train/doc_code/xgboost_quickstart.py), in Ray's own form. Synthetic data: iris-like
# CSV folders written next to the script instead of s3://ray-example-data/iris.
import os
import tempfile

import numpy as np
import pandas as pd

DATA = tempfile.mkdtemp()
for split, rows in (("train", 120), ("val", 30)):
    rng = np.random.default_rng(len(split))
    target = rng.integers(0, 3, rows)
    frame = pd.DataFrame(rng.normal(size=(rows, 4)) + target[:, None], columns=list("abcd"))
    frame["target"] = target
    os.makedirs(f"{DATA}/{split}")
    frame.to_csv(f"{DATA}/{split}/1.csv", index=False)

import xgboost

import ray.train
from ray.train.xgboost import XGBoostTrainer, RayTrainReportCallback

# 1. Load your data as a Ray Data Dataset.
train_dataset = ray.data.read_csv(f"{DATA}/train")
eval_dataset = ray.data.read_csv(f"{DATA}/val")


def train_func():
    # 2. Load your data shard as an `xgboost.DMatrix`.

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

    dtrain = xgboost.DMatrix(train_X, label=train_y)
    deval = xgboost.DMatrix(eval_X, label=eval_y)

    # 3. Define your xgboost model training parameters.
    params = {
        "tree_method": "approx",
        "objective": "reg:squarederror",
        "eta": 1e-4,
        "subsample": 0.5,
        "max_depth": 2,
    }

    # 4. Do distributed data-parallel training.
    bst = xgboost.train(
        params,
        dtrain=dtrain,
        evals=[(deval, "validation")],
        num_boost_round=10,
        # Optional: Save the model checkpoint manually instead.
        callbacks=[RayTrainReportCallback()],
    )


# 5. Configure scaling and resource requirements.
scaling_config = ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})

# 6. Launch distributed training job.
trainer = XGBoostTrainer(
    train_func,
    scaling_config=scaling_config,
    datasets={"train": train_dataset, "eval": eval_dataset},
)
result = trainer.fit()

# 7. Load the trained model
import os

with result.checkpoint.as_directory() as checkpoint_dir:
    model_path = os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME)
    model = xgboost.Booster()
    model.load_model(model_path)

assert model.num_boosted_rounds() == 10
assert "validation-rmse" in result.metrics
print("ROUNDTRIP-OK")

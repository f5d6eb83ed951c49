# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.4-2.6 (AIR) docs, "XGBoostTrainer" (doc/source/train/doc_code/gbdt_user_guide.py of
# Ray 2.5: datasets + label_column + params), in Ray's own form. Synthetic data: a
# breast-cancer-like table instead of s3://anonymous@air-example-data/breast_cancer.csv.
import numpy as np
import pandas as pd

import ray
from ray.air.config import ScalingConfig
from ray.train.xgboost import XGBoostTrainer, XGBoostCheckpoint

rng = np.random.default_rng(0)
frame = pd.DataFrame(rng.normal(size=(300, 4)), columns=["a", "b", "c", "d"])
frame["target"] = (frame["a"] + frame["b"] > 0).astype(int)
train_dataset = ray.data.from_pandas(frame.iloc[:240])
valid_dataset = ray.data.from_pandas(frame.iloc[240:])

trainer = XGBoostTrainer(
    scaling_config=ScalingConfig(
        # Number of workers to use for data parallelism.
        num_workers=2,
        # Whether to use GPU acceleration.
        use_gpu=False,
    ),
    label_column="target",
    num_boost_round=5,
    params={
        # XGBoost specific params
        "objective": "binary:logistic",
        # "tree_method": "gpu_hist",  # uncomment this to use GPU for training
        "eval_metric": ["logloss", "error"],
    },
    datasets={"train": train_dataset, "valid": valid_dataset},
)
result = trainer.fit()
print(result.metrics)

booster = XGBoostCheckpoint.from_checkpoint(result.checkpoint).get_model()
assert booster.num_boosted_rounds() == 5
assert "valid-error" in result.metrics
print("ROUNDTRIP-OK")

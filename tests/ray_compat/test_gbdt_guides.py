"""Ray's XGBoost and LightGBM guides, as a Ray user's script runs them, with phalanx imports.

Read from: "Get Started with Distributed Training using XGBoost / LightGBM" (Ray 2.60 docs,
https://docs.ray.io/en/latest/train/getting-started-xgboost.html and
getting-started-lightgbm.html: ``train_func`` + ``RayTrainReportCallback`` + ``get_model``) and
the AIR-era examples ``doc/source/ray-air/examples/xgboost_batch_prediction.py`` /
``lightgbm_example`` (Ray 2.5: ``datasets`` + ``label_column`` + ``params`` + ``preprocessor``).
Downloads are replaced by synthetic data of the same shape (a tabular binary/multiclass task).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import pytest

with contextlib.suppress(ImportError):  # lightgbm sets KMP_* variables when imported
    import lightgbm  # noqa: F401

import phalanx as train
import phalanx.data
from phalanx import RunConfig, ScalingConfig
from phalanx.preprocess import StandardScaler

pytestmark = pytest.mark.slow


def breast_cancer_like(rows: int, seed: int = 0) -> pd.DataFrame:
    """Numeric features with spaces in their names and a 0/1 ``target``, like the CSV the
    guides download."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 5)) * [1.0, 3.0, 10.0, 0.5, 2.0] + [14.0, 19.0, 90.0, 0.1, 1.0]
    names = ["mean radius", "mean texture", "mean perimeter", "mean smoothness", "worst area"]
    df = pd.DataFrame(x, columns=names)
    logit = (df["mean radius"] - 14) + (df["mean texture"] - 19) / 3 + rng.normal(size=rows) * 0.3
    df["target"] = (logit > 0).astype(np.int64)
    return df


def iris_like(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    target = rng.integers(0, 3, rows)
    centers = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]])
    x = centers[target] + rng.normal(size=(rows, 4)) * 0.25
    df = pd.DataFrame(x, columns=["sepal length", "sepal width", "petal length", "petal width"])
    df["target"] = target
    return df


@pytest.fixture
def run_config(tmp_path) -> RunConfig:
    return RunConfig(storage_path=str(tmp_path / "runs"), name="guide")


def test_xgboost_getting_started_train_func_with_report_callback(run_config):
    import xgboost

    from phalanx.xgboost import RayTrainReportCallback, XGBoostTrainer

    df = breast_cancer_like(1200)
    train_dataset = train.data.from_pandas(df.iloc[:1000])
    eval_dataset = train.data.from_pandas(df.iloc[1000:])

    def train_func():
        train_shard = train.get_dataset_shard("train").materialize().to_pandas()
        eval_shard = train.get_dataset_shard("validation").materialize().to_pandas()
        dtrain = xgboost.DMatrix(train_shard.drop("target", axis=1), label=train_shard["target"])
        deval = xgboost.DMatrix(eval_shard.drop("target", axis=1), label=eval_shard["target"])
        params = {
            "tree_method": "approx",
            "objective": "binary:logistic",
            "eval_metric": ["logloss", "error"],
            "max_depth": 3,
        }
        xgboost.train(
            params,
            dtrain=dtrain,
            evals=[(deval, "validation")],
            num_boost_round=10,
            callbacks=[RayTrainReportCallback()],
        )

    trainer = XGBoostTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=2),
        datasets={"train": train_dataset, "validation": eval_dataset},
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None
    assert {"validation-logloss", "validation-error"} <= set(result.metrics)
    assert result.metrics["validation-error"] < 0.2
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    assert booster.num_boosted_rounds() == 10
    test = df.iloc[1000:]
    predictions = booster.predict(xgboost.DMatrix(test.drop("target", axis=1)))
    assert ((predictions > 0.5) == test["target"]).mean() > 0.8


def test_xgboost_air_builtin_trainer_with_preprocessor_then_predictors(run_config):
    import xgboost

    from phalanx.xgboost import XGBoostCheckpoint, XGBoostPredictor, XGBoostTrainer

    df = breast_cancer_like(1500, seed=1)
    train_df, valid_df = df.iloc[:1200], df.iloc[1200:]
    columns_to_scale = ["mean radius", "mean texture"]
    trainer = XGBoostTrainer(
        label_column="target",
        num_boost_round=20,
        scaling_config=ScalingConfig(num_workers=2),
        params={"objective": "binary:logistic", "eval_metric": ["logloss", "error"]},
        datasets={"train": train_df, "valid": valid_df},
        preprocessor=StandardScaler(columns=columns_to_scale),
        run_config=run_config,
    )
    result = trainer.fit()
    assert {"train-logloss", "valid-logloss", "valid-error"} <= set(result.metrics)

    # The fitted scaler came back with the checkpoint, with the train set's statistics.
    scaler = result.checkpoint.get_preprocessor()
    scaled = scaler.transform_batch(train_df)
    assert abs(scaled["mean radius"].mean()) < 1e-6
    assert scaled["mean texture"].std(ddof=0) == pytest.approx(1.0, rel=1e-6)

    booster = XGBoostTrainer.get_model(result.checkpoint)
    same = XGBoostCheckpoint.from_checkpoint(result.checkpoint).get_model()
    assert same.num_boosted_rounds() == booster.num_boosted_rounds() == 20

    # A predictor applies the saved scaler to raw rows, then the booster.
    test_df = valid_df.drop(columns=["target"])
    predictor = XGBoostPredictor.from_checkpoint(result.checkpoint)
    got = predictor.predict(test_df)
    want = booster.predict(xgboost.DMatrix(scaler.transform_batch(test_df)))
    np.testing.assert_allclose(got["predictions"].to_numpy(), want, rtol=1e-6)
    assert ((got["predictions"] > 0.5).to_numpy() == valid_df["target"].to_numpy()).mean() > 0.8


def test_lightgbm_getting_started_train_func_with_network_params(run_config):
    import lightgbm as lgb

    from phalanx.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_network_params

    df = iris_like(900)
    train_dataset = train.data.from_pandas(df.iloc[:750])
    eval_dataset = train.data.from_pandas(df.iloc[750:])

    def train_func():
        train_df = train.get_dataset_shard("train").materialize().to_pandas()
        eval_df = train.get_dataset_shard("validation").materialize().to_pandas()
        train_set = lgb.Dataset(train_df.drop("target", axis=1), label=train_df["target"])
        eval_set = lgb.Dataset(eval_df.drop("target", axis=1), label=eval_df["target"])
        params = {
            "objective": "multiclass",
            "num_class": 3,
            "metric": ["multi_logloss", "multi_error"],
            "verbosity": -1,
            "tree_learner": "data_parallel",
            **get_network_params(),
        }
        lgb.train(
            params,
            train_set,
            valid_sets=[eval_set],
            valid_names=["eval"],
            num_boost_round=5,
            callbacks=[RayTrainReportCallback()],
        )

    trainer = LightGBMTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=2),
        datasets={"train": train_dataset, "validation": eval_dataset},
        run_config=run_config,
    )
    result = trainer.fit()
    assert {"eval-multi_logloss", "eval-multi_error"} <= set(result.metrics)
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    assert booster.current_iteration() == 5
    test = df.iloc[750:]
    probabilities = booster.predict(test.drop("target", axis=1))
    assert probabilities.shape == (150, 3)
    assert (probabilities.argmax(axis=1) == test["target"]).mean() > 0.9


def test_lightgbm_air_builtin_trainer_and_predictor_on_every_input_kind(run_config):
    from phalanx.lightgbm import LightGBMCheckpoint, LightGBMPredictor, LightGBMTrainer

    df = breast_cancer_like(1200, seed=2)
    result = LightGBMTrainer(
        label_column="target",
        params={"objective": "binary", "metric": ["binary_logloss", "binary_error"]},
        num_boost_round=15,
        datasets={"train": df.iloc[:1000], "valid": df.iloc[1000:]},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config,
    ).fit()
    assert {"train-binary_logloss", "valid-binary_error"} <= set(result.metrics)
    booster = LightGBMCheckpoint.from_checkpoint(result.checkpoint).get_model()
    assert booster.current_iteration() == 15

    features = df.iloc[1000:].drop(columns=["target"]).reset_index(drop=True)
    want = booster.predict(features)
    predictor = LightGBMPredictor.from_checkpoint(result.checkpoint)
    as_pandas = predictor.predict(features)
    as_numpy = predictor.predict(features.to_numpy())
    as_dict = predictor.predict({c: features[c].to_numpy() for c in features.columns})
    assert isinstance(as_pandas, pd.DataFrame) and isinstance(as_numpy, dict)
    np.testing.assert_allclose(as_pandas["predictions"].to_numpy(), want)
    np.testing.assert_allclose(as_numpy["predictions"], want)
    np.testing.assert_allclose(as_dict["predictions"], want)

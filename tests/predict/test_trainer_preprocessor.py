"""A trainer's preprocessor=: fitted on "train", applied as workers read, saved in checkpoints,
applied again by predictors to raw input."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

import phalanx as train
from phalanx import ConfigError, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.predict import BatchPredictor
from phalanx.preprocess import Chain, Concatenator, StandardScaler

torch = pytest.importorskip("torch")
from phalanx.predict import TorchPredictor  # noqa: E402
from phalanx.torch import TorchCheckpoint  # noqa: E402


def raw_frame(n: int = 1001) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    a, b = rng.normal(10, 3, n), rng.normal(-4, 0.5, n)
    return pd.DataFrame({"id": np.arange(n), "a": a, "b": b, "y": 2 * a - b})


def make_preprocessor() -> Chain:
    return Chain(StandardScaler(["a", "b"]), Concatenator(["a", "b"], "x", dtype=np.float32))


def fit_linear(config):
    shard = train.get_dataset_shard("train")
    frame = shard.to_pandas()
    x = np.stack(frame["x"]).astype(np.float32)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    target = torch.as_tensor(frame["y"].to_numpy(np.float32)).unsqueeze(1)
    for _ in range(50):
        optimizer.zero_grad()
        loss = ((model(torch.as_tensor(x)) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
    rank = train.get_context().get_world_rank()
    checkpoint = TorchCheckpoint.from_state_dict(model.state_dict()) if rank == 0 else None
    train.report(
        {"x_mean": x.mean(axis=0).tolist(), "x_std": x.std(axis=0).tolist(), "rows": len(x)},
        checkpoint=checkpoint,
    )


@pytest.mark.slow
def test_train_with_a_preprocessor_then_batch_predict_raw_parquet(tmp_path):
    df = raw_frame()
    preprocessor = make_preprocessor()
    result = DataParallelTrainer(
        fit_linear,
        datasets={"train": df},
        preprocessor=preprocessor,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="prep", storage_path=str(tmp_path / "runs")),
    ).fit()

    # fitted on all of "train" in the driver; the workers read standardized, concatenated rows
    ranks = result.all_ranks_metrics_dataframe
    assert list(ranks["rows"]) == [500, 500]
    means = np.array(ranks["x_mean"].tolist())
    assert np.abs(means.mean(axis=0)).max() < 0.1
    assert np.allclose(np.array(ranks["x_std"].tolist()), 1.0, atol=0.1)
    assert "preprocessor.pkl" in os.listdir(result.checkpoint.path)

    # raw Parquet in, predictions out: the checkpoint's preprocessor is applied automatically
    folder = tmp_path / "raw"
    folder.mkdir()
    raw = df.drop(columns=["y"])
    raw.iloc[:600].to_parquet(folder / "p0.parquet")
    raw.iloc[600:].to_parquet(folder / "p1.parquet")
    model = torch.nn.Linear(2, 1)
    got = (
        BatchPredictor.from_checkpoint(result.checkpoint, TorchPredictor, model=model)
        .predict(
            str(folder), num_workers=2, batch_size=128, feature_columns=["x"], keep_columns=["id"]
        )
        .to_pandas()
    )
    assert got["id"].tolist() == list(range(len(df)))
    single = TorchPredictor.from_checkpoint(result.checkpoint, model=torch.nn.Linear(2, 1))
    want = np.stack(single.predict(raw, feature_columns=["x"])["predictions"])
    np.testing.assert_allclose(np.stack(got["predictions"]), want, rtol=1e-5)
    # and by hand: the same model on the same preprocessing
    state = torch.load(os.path.join(result.checkpoint.path, "model.pt"))
    by_hand = torch.nn.Linear(2, 1)
    by_hand.load_state_dict(state)
    x = np.stack(preprocessor.transform_batch(raw)["x"]).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(want, by_hand(torch.as_tensor(x)).numpy(), rtol=1e-5)


def test_a_preprocessor_needs_a_train_dataset(tmp_path):
    trainer = DataParallelTrainer(
        lambda: None,
        datasets={"valid": raw_frame(10)},
        preprocessor=make_preprocessor(),
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="noprep", storage_path=str(tmp_path)),
    )
    with pytest.raises(ConfigError, match="named 'train'"):
        trainer.fit()


def test_a_non_preprocessor_is_rejected_at_construction():
    with pytest.raises(ConfigError, match="preprocessor="):
        DataParallelTrainer(lambda: None, preprocessor=object())


@pytest.mark.slow
@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_gbdt_with_a_preprocessor_then_batch_predict_raw_parquet(tmp_path, library):
    lib = pytest.importorskip(library)
    from phalanx.predict import LightGBMPredictor, XGBoostPredictor

    df = raw_frame(2000)
    df["y"] = (df["a"] - 10 + 4 * (df["b"] + 4) > 0).astype(int)
    if library == "xgboost":
        from phalanx.xgboost import XGBoostTrainer as Trainer

        params, predictor_cls = {"objective": "binary:logistic", "max_depth": 3}, XGBoostPredictor
    else:
        from phalanx.lightgbm import LightGBMTrainer as Trainer

        params = {"objective": "binary", "num_leaves": 7, "verbose": -1}
        predictor_cls = LightGBMPredictor
    preprocessor = StandardScaler(["a", "b"])
    result = Trainer(
        datasets={"train": df.drop(columns=["id"])},
        label_column="y",
        params=params,
        num_boost_round=10,
        preprocessor=preprocessor,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=library, storage_path=str(tmp_path / "runs")),
    ).fit()
    assert "preprocessor.pkl" in os.listdir(result.checkpoint.path)

    folder = tmp_path / "raw"
    folder.mkdir()
    raw = df.drop(columns=["y"])
    raw.iloc[:1200].to_parquet(folder / "p0.parquet")
    raw.iloc[1200:].to_parquet(folder / "p1.parquet")
    got = (
        BatchPredictor.from_checkpoint(result.checkpoint, predictor_cls)
        .predict(str(folder), num_workers=2, feature_columns=["a", "b"], keep_columns=["id"])
        .to_pandas()
    )
    assert got["id"].tolist() == list(range(len(df)))
    single = predictor_cls.from_checkpoint(result.checkpoint)
    want = np.asarray(single.predict(raw, feature_columns=["a", "b"])["predictions"])
    np.testing.assert_allclose(np.asarray(got["predictions"]), want, rtol=1e-6)
    model = Trainer.get_model(result.checkpoint)
    scaled = preprocessor.transform_batch(raw)[["a", "b"]]
    by_hand = model.predict(lib.DMatrix(scaled) if library == "xgboost" else scaled)
    np.testing.assert_allclose(want, by_hand, rtol=1e-5)
    assert ((want > 0.5) == df["y"].to_numpy()).mean() > 0.9  # it learned

"""AIR-era batch prediction (Ray 2.4-2.6), as a Ray user's script ran it, with phalanx imports.

Read from Ray 2.5's ``doc/source/ray-air/examples/pytorch_tabular_batch_prediction.py``
(a ``Concatenator(exclude=...)`` preprocessor saved in ``TorchCheckpoint.from_model``, then
``BatchPredictor.from_checkpoint(checkpoint, TorchPredictor).predict(ds,
feature_columns=[...])`` and ``show()``), ``xgboost_batch_prediction.py`` (a trainer's
preprocessor reused by ``BatchPredictor`` + ``XGBoostPredictor``), ``doc_code/predictors.py``
(a Predictor on a numpy array) and ``BatchPredictor.from_pandas_udf``'s docstring (accuracy with
``map_batches``). The kinds ``Predictor.predict`` returns follow ``ray/train/predictor.py`` of
Ray 2.4-2.6: DataFrame -> DataFrame, numpy array or dict -> dict of arrays; a pyarrow Table
(an error there) gives a Table, as in Ray 2.0-2.2.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

with contextlib.suppress(ImportError):  # lightgbm sets KMP_* variables when imported
    import lightgbm  # noqa: F401

import phalanx.data
from phalanx import RunConfig, ScalingConfig
from phalanx.predict import BatchPredictor
from phalanx.preprocess import Concatenator, StandardScaler

torch = pytest.importorskip("torch")
from phalanx.torch import TorchCheckpoint, TorchPredictor  # noqa: E402


def create_model(input_features: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(input_features, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 1),
        torch.nn.Sigmoid(),
    )


def breast_cancer_like(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    df = pd.DataFrame(rng.normal(size=(rows, 4)), columns=["a", "b", "c", "d"])
    df["target"] = (df["a"] + df["b"] > 0).astype(np.int64)
    return df


@pytest.mark.slow
def test_pytorch_tabular_batch_prediction_with_concatenator_in_the_checkpoint():
    dataset = phalanx.data.from_pandas(breast_cancer_like(300))
    num_features = len(dataset.schema().names) - 1
    prep = Concatenator(output_column_name="concat_features", exclude=["target"], dtype=np.float32)
    model = create_model(num_features)
    checkpoint = TorchCheckpoint.from_model(model=model, preprocessor=prep)

    # A whole pickled model runs code when loaded: phalanx asks for weights_only=False (Ray
    # always loads with it); state-dict checkpoints need nothing.
    batch_predictor = BatchPredictor.from_checkpoint(checkpoint, TorchPredictor, weights_only=False)
    predicted = batch_predictor.predict(
        dataset, feature_columns=["concat_features"], keep_columns=["target"], batch_size=64
    )
    assert predicted.count() == 300
    assert predicted.columns() == ["predictions", "target"]
    first = predicted.take(3)
    assert len(first) == 3 and set(first[0]) == {"predictions", "target"}

    frame = predicted.to_pandas()
    raw = breast_cancer_like(300)
    with torch.no_grad():
        want = model(
            torch.as_tensor(raw[["a", "b", "c", "d"]].to_numpy(np.float32, copy=True))
        ).numpy()
    np.testing.assert_allclose(np.stack(frame["predictions"]), want, rtol=1e-5)
    assert frame["target"].tolist() == raw["target"].tolist()


@pytest.mark.slow
def test_xgboost_batch_prediction_reuses_the_trainers_preprocessor(tmp_path, capsys):
    import xgboost

    from phalanx.xgboost import XGBoostPredictor, XGBoostTrainer

    df = breast_cancer_like(800)
    train_df, valid_df = df.iloc[:600], df.iloc[600:]
    test_dataset = phalanx.data.from_pandas(valid_df.drop(columns=["target"]))
    result = XGBoostTrainer(
        label_column="target",
        num_boost_round=10,
        scaling_config=ScalingConfig(num_workers=2),
        params={"objective": "binary:logistic", "eval_metric": ["logloss", "error"]},
        datasets={"train": train_df},
        preprocessor=StandardScaler(columns=["a", "b"]),
        run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="xgb"),
    ).fit()

    batch_predictor = BatchPredictor.from_checkpoint(result.checkpoint, XGBoostPredictor)
    predicted_probabilities = batch_predictor.predict(test_dataset, num_workers=2)
    capsys.readouterr()  # the workers' own output
    predicted_probabilities.show(limit=2)
    shown = capsys.readouterr().out.strip().splitlines()
    assert len(shown) == 2 and shown[0].startswith("{'predictions': ")
    assert predicted_probabilities.count() == 200

    scaler = result.checkpoint.get_preprocessor()
    booster = XGBoostTrainer.get_model(result.checkpoint)
    features = valid_df.drop(columns=["target"])
    want = booster.predict(xgboost.DMatrix(scaler.transform_batch(features)))
    got = np.array([row["predictions"] for row in predicted_probabilities.take_all()])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_predictor_returns_the_kind_it_was_given():
    model = torch.nn.Linear(2, 1)
    checkpoint = TorchCheckpoint.from_state_dict(model.state_dict())
    predictor = TorchPredictor.from_checkpoint(checkpoint, model=torch.nn.Linear(2, 1))
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    with torch.no_grad():
        want = model(torch.as_tensor(x)).numpy()

    from_array = predictor.predict(x)  # AIR 2.4-2.6: an array in, a dict of arrays out
    assert isinstance(from_array, dict) and list(from_array) == ["predictions"]
    np.testing.assert_allclose(from_array["predictions"], want, rtol=1e-6)

    frame = pd.DataFrame({"x": list(x)})
    from_frame = predictor.predict(frame)
    assert isinstance(from_frame, pd.DataFrame)
    np.testing.assert_allclose(np.stack(from_frame["predictions"]), want, rtol=1e-6)

    table = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(x)})
    from_table = predictor.predict(table)
    assert isinstance(from_table, pa.Table) and from_table.num_rows == 3
    np.testing.assert_allclose(
        np.stack(from_table.column("predictions").to_pylist()), want, rtol=1e-6
    )

    # One column: the model gets that tensor; dtype converts it (float64 rows, float32 model).
    one_column = predictor.predict({"x": x.astype(np.float64)}, dtype=torch.float32)
    np.testing.assert_allclose(one_column["predictions"], want, rtol=1e-6)


def test_gbdt_predictors_take_numpy_with_column_indices(tmp_path):
    xgboost = pytest.importorskip("xgboost")
    from phalanx.xgboost import XGBoostCheckpoint, XGBoostPredictor

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 2))
    booster = xgboost.train({"max_depth": 2}, xgboost.DMatrix(x, label=x[:, 0] > 0), 5)
    checkpoint = XGBoostCheckpoint.from_model(booster, path=str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "model.json").exists()
    predictor = XGBoostPredictor.from_checkpoint(checkpoint)
    wide = np.column_stack([x, np.full(200, 99.0)])  # an extra column the model never saw
    out = predictor.predict(wide, feature_columns=[0, 1])
    np.testing.assert_allclose(out["predictions"], booster.predict(xgboost.DMatrix(x)))
    with pytest.raises(ValueError, match="keep_columns"):
        predictor.predict(wide, keep_columns=["id"])


def test_checkpoint_preprocessor_round_trip_and_rays_metadata_key(tmp_path):
    import cloudpickle

    from phalanx import Checkpoint

    prep = StandardScaler(columns=["a"]).fit(pd.DataFrame({"a": [1.0, 3.0]}))
    checkpoint = Checkpoint.from_directory(str(tmp_path / "mine"))
    checkpoint.set_preprocessor(prep)
    assert checkpoint.get_preprocessor().stats_ == prep.stats_
    # A checkpoint written by Ray's FrameworkCheckpoint.set_preprocessor: hex in metadata.
    ray_style = Checkpoint.from_directory(str(tmp_path / "ray"))
    ray_style.set_metadata({"preprocessor_pkl": cloudpickle.dumps(prep).hex()})
    assert ray_style.get_preprocessor().stats_ == prep.stats_
    empty = Checkpoint.from_directory(str(tmp_path / "none"))
    empty.set_metadata({})
    assert empty.get_preprocessor() is None


@pytest.mark.slow
def test_batch_predictor_from_pandas_udf_and_accuracy_with_map_batches():
    def calculate_accuracy(df: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"correct": df["preds"] == df["label"]})

    batch_pred = BatchPredictor.from_pandas_udf(
        lambda data: pd.DataFrame({"preds": data["feature_1"]})
    )
    ds = phalanx.data.from_pandas(pd.DataFrame({"feature_1": [1, 2, 3], "label": [1, 2, 4]}))
    predictions = batch_pred.predict(
        ds, feature_columns=["feature_1"], keep_columns=["label"], num_workers=1
    )
    assert predictions.take_all() == [
        {"preds": 1, "label": 1},
        {"preds": 2, "label": 2},
        {"preds": 3, "label": 4},
    ]
    correct = predictions.map_batches(calculate_accuracy, batch_format="pandas")
    assert correct.sum(on="correct") / correct.count() == pytest.approx(2 / 3)

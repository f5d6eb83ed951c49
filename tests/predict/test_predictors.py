"""Predictor base, TorchPredictor, GBDT predictors: input kinds, preprocessing, clear errors."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pandas as pd
import pytest

from phalanx import Checkpoint
from phalanx.predict import Predictor, PredictorNotSerializableError, checkpoint_framework
from phalanx.preprocess import Chain, Concatenator, StandardScaler

torch = pytest.importorskip("torch")
from phalanx.predict import TorchPredictor  # noqa: E402
from phalanx.torch._checkpoint import TorchCheckpoint  # noqa: E402


def make_frame(n: int = 50) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame({"id": np.arange(n), "a": rng.normal(3, 2, n), "b": rng.normal(-1, 5, n)})


def make_checkpoint(df: pd.DataFrame) -> tuple[TorchCheckpoint, torch.nn.Module, Chain]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    prep = Chain(StandardScaler(["a", "b"]), Concatenator(["a", "b"], "x", dtype=np.float32))
    prep.fit(df)
    return TorchCheckpoint.from_state_dict(model.state_dict(), preprocessor=prep), model, prep


def expected(model, prep, df):
    x = np.stack(prep.transform_batch(df)["x"])
    with torch.no_grad():
        return model(torch.as_tensor(x)).numpy()


def test_torch_predictor_pandas_in_pandas_out_with_checkpoint_preprocessor():
    df = make_frame()
    checkpoint, model, prep = make_checkpoint(df)
    predictor = TorchPredictor.from_checkpoint(checkpoint, model=torch.nn.Linear(2, 1))
    out = predictor.predict(df, feature_columns=["x"], keep_columns=["id"])
    assert isinstance(out, pd.DataFrame) and list(out.columns) == ["predictions", "id"]
    np.testing.assert_allclose(np.stack(out["predictions"]), expected(model, prep, df), rtol=1e-6)
    assert (out["id"] == df["id"]).all()


def test_torch_predictor_dict_in_dict_out():
    df = make_frame()
    checkpoint, model, prep = make_checkpoint(df)
    predictor = TorchPredictor.from_checkpoint(checkpoint, model=torch.nn.Linear(2, 1))
    batch = {c: df[c].to_numpy() for c in df.columns}
    out = predictor.predict(batch, feature_columns=["x"])
    assert isinstance(out, dict) and out["predictions"].shape == (50, 1)
    np.testing.assert_allclose(out["predictions"], expected(model, prep, df), rtol=1e-6)


class TwoHeads(torch.nn.Module):
    def forward(self, inputs):
        return {"sum": inputs["a"] + inputs["b"], "diff": inputs["a"] - inputs["b"]}


def test_several_inputs_and_outputs_and_dtype():
    predictor = TorchPredictor(TwoHeads())
    out = predictor.predict({"a": np.ones(3), "b": np.arange(3.0)}, dtype=torch.float32)
    assert set(out) == {"sum", "diff"} and out["sum"].dtype == np.float32
    np.testing.assert_array_equal(out["diff"][:, 0], [1, 0, -1])


def test_missing_feature_columns_are_named():
    predictor = TorchPredictor(torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match=r"(?s)feature_columns.*\['zz'\].*HINT"):
        predictor.predict(make_frame(), feature_columns=["zz"])


def test_a_predictor_refuses_to_pickle():
    with pytest.raises(PredictorNotSerializableError, match="HINT"):
        pickle.dumps(TorchPredictor(torch.nn.Linear(2, 1)))


def test_checkpoint_of_another_framework_is_named(tmp_path):
    (tmp_path / "model.txt").write_text("tree\n")
    checkpoint = Checkpoint(str(tmp_path))
    assert checkpoint_framework(checkpoint) == "lightgbm"
    with pytest.raises(ValueError, match="holds a LightGBM model, not PyTorch"):
        TorchPredictor.from_checkpoint(checkpoint, model=torch.nn.Linear(2, 1))


def test_metadata_names_the_framework(tmp_path):
    checkpoint = Checkpoint(str(tmp_path))
    checkpoint.set_metadata({"framework": "xgboost"})
    from phalanx.predict import LightGBMPredictor

    with pytest.raises(ValueError, match="holds a XGBoost model, not LightGBM"):
        LightGBMPredictor.from_checkpoint(checkpoint)


def test_base_predictor_rejects_other_inputs():
    with pytest.raises(TypeError, match="pandas DataFrame, a numpy array, a dict"):
        Predictor().predict([1, 2])


def test_xgboost_predictor_matches_booster(tmp_path):
    xgb = pytest.importorskip("xgboost")
    df = make_frame(200)
    booster = xgb.train({"max_depth": 2}, xgb.DMatrix(df[["a", "b"]], label=df["a"] > 3), 5)
    booster.save_model(os.path.join(tmp_path, "model.ubj"))
    predictor = __import__("phalanx.predict", fromlist=["x"]).XGBoostPredictor
    p = predictor.from_checkpoint(Checkpoint(str(tmp_path)))
    out = p.predict(df, feature_columns=["a", "b"], keep_columns=["id"])
    np.testing.assert_allclose(out["predictions"], booster.predict(xgb.DMatrix(df[["a", "b"]])))
    with pytest.raises(ValueError, match="holds a XGBoost model, not PyTorch"):
        TorchPredictor.from_checkpoint(Checkpoint(str(tmp_path)))


def test_lightgbm_predictor_matches_booster(tmp_path):
    lgb = pytest.importorskip("lightgbm")
    df = make_frame(200)
    params = {"objective": "regression", "verbose": -1, "num_threads": 1, "min_data_in_leaf": 5}
    booster = lgb.train(params, lgb.Dataset(df[["a", "b"]], label=df["a"]), 5)
    booster.save_model(os.path.join(tmp_path, "model.txt"))
    from phalanx.predict import LightGBMPredictor

    out = LightGBMPredictor.from_checkpoint(Checkpoint(str(tmp_path))).predict(
        {"a": df["a"].to_numpy(), "b": df["b"].to_numpy()}
    )
    np.testing.assert_allclose(out["predictions"], booster.predict(df[["a", "b"]]))

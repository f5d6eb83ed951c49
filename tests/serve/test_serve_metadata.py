"""GET /metadata lists the model's input columns when the model or its preprocessor knows them."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import xgboost
from serve_models import make_net, raw_frame

import phalanx.serve
from phalanx.predict import XGBoostPredictor
from phalanx.preprocess import Chain, Concatenator, StandardScaler
from phalanx.serve._columns import input_columns


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["xgboost", "lightgbm", "torch"])
def test_metadata_lists_the_columns_a_request_should_carry(runs, framework):
    # Each run has a preprocessor reading a and b (torch: scaled, then packed into one column x).
    result = runs(framework)
    kwargs = {"model": make_net()} if framework == "torch" else {}
    with phalanx.serve.serve(result.path, port=0, **kwargs) as server:
        metadata = httpx.get(f"{server.url}/metadata").json()
    assert metadata["input_columns"] == ["a", "b"]
    assert metadata["feature_columns"] is None  # not required: the preprocessor may add some


def booster(frame) -> xgboost.Booster:
    return xgboost.train({"max_depth": 2}, xgboost.DMatrix(frame, label=[0, 1] * 5), 2)


def test_input_columns_come_from_the_booster_and_the_preprocessor():
    frame = raw_frame(10).drop(columns=["y"])
    named = booster(frame)
    assert input_columns(XGBoostPredictor(named)) == ["a", "b"]
    assert input_columns(XGBoostPredictor(booster(frame.to_numpy()))) is None  # f0, f1
    packed = Chain(StandardScaler(["a"]), Concatenator(["a", "b"], "x", dtype=np.float32))
    assert input_columns(XGBoostPredictor(booster(frame), preprocessor=packed)) == ["a", "b"]
    # The booster reads "a" (scaled in place) and "c", which no stage makes: a raw input too.
    frame_c = frame.rename(columns={"b": "c"})
    assert input_columns(
        XGBoostPredictor(booster(frame_c), preprocessor=StandardScaler(["a"]))
    ) == ["a", "c"]

"""AIR-era predictor behaviour: input kinds, keep_columns, BatchMapper, pickling checks."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import phalanx
import phalanx.data
from phalanx import ConfigError, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.predict import BatchPredictor, Predictor
from phalanx.preprocess import BatchMapper, Concatenator


def udf(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"preds": df["a"] * 2})


def test_a_pandas_predictor_takes_every_kind_and_returns_the_same():
    predictor = Predictor.from_pandas_udf(udf)
    data = {"a": np.array([1, 2, 3])}
    assert predictor.predict(data)["preds"].tolist() == [2, 4, 6]  # dict -> dict
    frame = predictor.predict(pd.DataFrame(data))
    assert isinstance(frame, pd.DataFrame) and frame["preds"].tolist() == [2, 4, 6]
    table = predictor.predict(pa.table(data))
    assert isinstance(table, pa.Table) and table.column("preds").to_pylist() == [2, 4, 6]
    with pytest.raises(TypeError, match="pyarrow Table"):
        predictor.predict([1, 2, 3])


def test_keep_columns_come_from_the_preprocessed_batch_else_the_raw_input():
    predictor = Predictor.from_pandas_udf(lambda df: pd.DataFrame({"n": df["x"].map(len)}))
    predictor.set_preprocessor(Concatenator(output_column_name="x", include=["a", "b"]))
    raw = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0], "id": [7, 8]})
    out = predictor.predict(raw, feature_columns=["x"], keep_columns=["x", "a", "id"])
    assert out["n"].tolist() == [2, 2]
    assert out["id"].tolist() == [7, 8]  # in both: taken from the preprocessed batch
    assert out["a"].tolist() == [1.0, 2.0]  # packed away by the preprocessor: from the raw rows
    assert [list(v) for v in out["x"]] == [[1.0, 3.0], [2.0, 4.0]]
    with pytest.raises(ValueError, match=r"(?s)keep_columns.*\['zz'\].*HINT"):
        predictor.predict(raw, keep_columns=["zz"])


def test_xgboost_predictor_on_a_pyarrow_table_returns_a_table():
    xgboost = pytest.importorskip("xgboost")
    from phalanx.xgboost import XGBoostPredictor

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.normal(size=100), "b": rng.normal(size=100)})
    booster = xgboost.train({"max_depth": 2}, xgboost.DMatrix(df, label=df["a"] > 0), 3)
    out = XGBoostPredictor(booster).predict(pa.Table.from_pandas(df))
    assert isinstance(out, pa.Table)
    np.testing.assert_allclose(
        out.column("predictions").to_numpy(), booster.predict(xgboost.DMatrix(df))
    )


def test_batch_mapper_numpy_format_and_input_kind_round_trip():
    mapper = BatchMapper(lambda b: {"y": b["x"] + 1}, batch_format="numpy")
    assert mapper.transform_batch({"x": np.arange(3)})["y"].tolist() == [1, 2, 3]
    frame = mapper.transform_batch(pd.DataFrame({"x": [5]}))
    assert isinstance(frame, pd.DataFrame) and frame["y"].tolist() == [6]
    table = mapper.transform_batch(pa.table({"x": [1]}))
    assert isinstance(table, pa.Table) and table.column("y").to_pylist() == [2]
    assert mapper.fit_status() == "NOT_FITTABLE"
    restored = BatchMapper.deserialize(mapper.serialize())  # a lambda survives (cloudpickle)
    assert restored.transform_batch({"x": np.arange(2)})["y"].tolist() == [1, 2]
    with pytest.raises(ConfigError, match="batch_format"):
        BatchMapper(lambda b: b, batch_format="arrow")


def test_an_unpicklable_preprocessor_fails_at_trainer_construction():
    mapper = BatchMapper(lambda df: df, batch_format="pandas")
    mapper.lock = threading.Lock()  # state added after construction
    with pytest.raises(ConfigError, match=r"(?s)cannot be pickled.*HINT"):
        DataParallelTrainer(
            lambda: None, datasets={"train": {"x": np.arange(3)}}, preprocessor=mapper
        )


def test_a_lambda_preprocessor_is_saved_in_checkpoints_and_comes_back(tmp_path):
    def loop():
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            with open(f"{d}/weights.bin", "w") as f:
                f.write("weights")
            phalanx.report({"x": 1}, checkpoint=phalanx.Checkpoint.from_directory(d))

    result = DataParallelTrainer(
        loop,
        datasets={"train": {"x": np.arange(4)}},
        preprocessor=BatchMapper(lambda df: df.assign(x=df["x"] * 10), batch_format="pandas"),
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(storage_path=str(tmp_path), name="prep"),
    ).fit()
    saved = result.checkpoint.get_preprocessor()
    assert saved.transform_batch(pd.DataFrame({"x": [1, 2]}))["x"].tolist() == [10, 20]


def test_batch_predictor_checks_before_any_worker_starts():
    bp = BatchPredictor.from_pandas_udf(udf)
    bp.set_preprocessor(Concatenator(output_column_name="packed", include=["b"]))
    data = pd.DataFrame({"a": [1, 2], "b": [3, 4]})
    bp._check_keep_columns(phalanx.data.from_pandas(data), ["packed", "a"])  # made by the prep
    with pytest.raises(ValueError, match=r"keep_columns.*\['nope'\]"):
        bp.predict(data, keep_columns=["nope"])
    with pytest.raises(ValueError, match=r"(?s)ray_remote_args.*\['max_retries'\].*HINT"):
        bp.predict(data, ray_remote_args={"max_retries": 3})


def test_gpus_asked_for_turn_on_use_gpu_for_predictors_that_take_it():
    torch = pytest.importorskip("torch")  # noqa: F841
    from phalanx.torch import TorchCheckpoint, TorchPredictor

    bp = BatchPredictor(TorchCheckpoint("/nonexistent"), TorchPredictor, model=None)
    assert bp._predictor_kwargs_for({"GPU": 1.0})["use_gpu"] is True
    assert "use_gpu" not in bp._predictor_kwargs_for({"CPU": 1.0})
    assert "use_gpu" not in BatchPredictor.from_pandas_udf(udf)._predictor_kwargs_for({"GPU": 1})

"""SklearnCheckpoint and SklearnPredictor with real scikit-learn estimators: every input kind
the other predictors take, feature and kept columns, BatchPredictor, and ``phalanx serve``."""

from __future__ import annotations

import cloudpickle
import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import Ridge
from sklearn_models import classification, regression

import phalanx
import phalanx.serve
from phalanx.predict import BatchPredictor
from phalanx.preprocess import StandardScaler
from phalanx.sklearn import SklearnCheckpoint, SklearnPredictor, SklearnTrainer

COLUMNS = ["a", "b", "c", "d"]


@pytest.fixture(scope="module")
def fitted() -> tuple[Ridge, pd.DataFrame]:
    df = regression(200)
    return Ridge().fit(df[COLUMNS], df["y"]), df


def test_every_input_kind_gives_the_estimators_predictions(fitted):
    estimator, df = fitted
    want = estimator.predict(df[COLUMNS])
    predictor = SklearnPredictor(estimator)
    frame = predictor.predict(df, feature_columns=COLUMNS, keep_columns=["y"])
    assert list(frame.columns) == ["predictions", "y"]
    np.testing.assert_allclose(frame["predictions"], want)
    arrays = predictor.predict({c: df[c].to_numpy() for c in COLUMNS})
    np.testing.assert_allclose(arrays["predictions"], want)
    table = predictor.predict(pa.Table.from_pandas(df[COLUMNS]))
    assert isinstance(table, pa.Table)
    np.testing.assert_allclose(table.column("predictions").to_numpy(), want)
    matrix = Ridge().fit(df[COLUMNS].to_numpy(), df["y"])  # fitted without feature names
    extra = np.column_stack([df[COLUMNS].to_numpy(), np.zeros(len(df))])
    by_index = SklearnPredictor(matrix).predict(extra, feature_columns=[0, 1, 2, 3])
    np.testing.assert_allclose(by_index["predictions"], want)


def test_several_outputs_become_numbered_columns_and_n_jobs_is_set():
    df = classification(200)
    forest = RandomForestClassifier(n_estimators=5, n_jobs=3, random_state=0)
    targets = np.column_stack([df["y"], 1 - df["y"]])
    forest.fit(df[COLUMNS], targets)
    predictor = SklearnPredictor(forest)
    out = predictor.predict(df[COLUMNS])
    assert list(out.columns) == ["predictions_0", "predictions_1"]
    assert forest.n_jobs == 1  # num_estimator_cpus=1, as in Ray
    predictor.predict(df[COLUMNS], num_estimator_cpus=None)
    assert forest.n_jobs == 1
    predictor.predict(df[COLUMNS], num_estimator_cpus=2)
    assert forest.n_jobs == 2


def test_checkpoint_round_trip_with_a_preprocessor(fitted, tmp_path):
    estimator, df = fitted
    scaler = StandardScaler(columns=COLUMNS).fit(df)
    scaled_model = Ridge().fit(scaler.transform_batch(df.copy())[COLUMNS], df["y"])
    path = tmp_path / "mine"
    checkpoint = SklearnCheckpoint.from_estimator(scaled_model, path=path, preprocessor=scaler)
    assert checkpoint.path == str(path) and (path / "model.pkl").is_file()
    assert checkpoint.get_estimator().coef_ == pytest.approx(scaled_model.coef_)
    predictor = SklearnPredictor.from_checkpoint(checkpoint)
    assert predictor.get_preprocessor() is not None
    np.testing.assert_allclose(
        predictor.predict(df[COLUMNS])["predictions"],
        scaled_model.predict(scaler.transform_batch(df.copy())[COLUMNS]),
    )
    temporary = SklearnCheckpoint.from_estimator(estimator)  # no path: a new directory
    assert temporary.get_model().coef_ == pytest.approx(estimator.coef_)


def test_an_air_checkpoint_named_model_loads(fitted, tmp_path):
    estimator, df = fitted
    (tmp_path / "model").write_bytes(cloudpickle.dumps(estimator))  # AIR's MODEL_KEY
    checkpoint = SklearnCheckpoint.from_directory(str(tmp_path))
    predictor = SklearnPredictor.from_checkpoint(checkpoint)
    np.testing.assert_allclose(
        predictor.predict(df[COLUMNS])["predictions"], estimator.predict(df[COLUMNS])
    )


def test_a_checkpoint_of_another_kind_is_refused(tmp_path):
    empty = phalanx.Checkpoint.from_directory(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"model\.pkl.*\nHINT: use a checkpoint saved"):
        SklearnPredictor.from_checkpoint(empty)
    (tmp_path / "model.txt").write_text("tree\n")  # LightGBM's file
    with pytest.raises(ValueError, match="holds a LightGBM model, not Sklearn"):
        SklearnPredictor.from_checkpoint(empty)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> phalanx.Result:
    df = regression(300, offset=5.0)
    return SklearnTrainer(
        Ridge(),
        label_column="y",
        datasets={"train": df},
        preprocessor=StandardScaler(columns=COLUMNS),
        run_config=phalanx.RunConfig(storage_path=str(tmp_path_factory.mktemp("runs"))),
    ).fit()


def test_batch_predictor_matches_the_predictor(trained):
    df = regression(250, seed=3, offset=5.0)
    df["id"] = np.arange(len(df))
    want = SklearnPredictor.from_checkpoint(trained.checkpoint).predict(df[COLUMNS])
    batch = BatchPredictor.from_checkpoint(trained.checkpoint, SklearnPredictor)
    got = batch.predict(df, batch_size=64, feature_columns=COLUMNS, keep_columns=["id"])
    got = got.to_pandas()
    assert got["id"].tolist() == list(range(250))
    np.testing.assert_allclose(got["predictions"], want["predictions"])


@pytest.mark.parametrize("predictor", ["sklearn", None])
def test_serve_by_name_or_by_the_checkpoints_files(trained, predictor):
    rows = regression(7, seed=4, offset=5.0)[COLUMNS]
    want = SklearnPredictor.from_checkpoint(trained.checkpoint).predict(rows)["predictions"]
    with phalanx.serve.serve(trained.path, predictor, port=0) as server:
        assert httpx.get(f"{server.url}/metadata").json()["framework"] == "sklearn"
        response = httpx.post(
            f"{server.url}/predict", json={"records": rows.to_dict("records")}, timeout=60
        )
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["predictions"], want)

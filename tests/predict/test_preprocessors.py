"""Preprocessors against scikit-learn's equivalents, streaming fit, errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import phalanx.data
from phalanx.preprocess import (
    Chain,
    Concatenator,
    FitStatus,
    LabelEncoder,
    MinMaxScaler,
    OneHotEncoder,
    OrdinalEncoder,
    PreprocessorNotFittedError,
    SimpleImputer,
    StandardScaler,
)

sk = pytest.importorskip("sklearn.preprocessing")
skimpute = pytest.importorskip("sklearn.impute")


@pytest.fixture
def df() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = 1000
    a = rng.normal(5, 3, n)
    a[rng.random(n) < 0.1] = np.nan
    return pd.DataFrame(
        {
            "a": a,
            "b": rng.uniform(-2, 7, n),
            "c": rng.choice(["red", "green", "blue", "cyan"], n, p=[0.4, 0.3, 0.2, 0.1]),
            "k": rng.integers(0, 5, n),
        }
    )


def test_standard_scaler_matches_sklearn_in_small_batches(df):
    scaler = StandardScaler(["a", "b"]).fit(df, batch_size=64)
    got = scaler.transform_batch(df)[["a", "b"]].to_numpy()
    want = sk.StandardScaler().fit_transform(df[["a", "b"]])
    np.testing.assert_allclose(got, want, rtol=1e-10, equal_nan=True)


def test_min_max_scaler_matches_sklearn(df):
    scaler = MinMaxScaler(["b", "k"], output_columns=["b2", "k2"]).fit(df, batch_size=100)
    out = scaler.transform_batch(df)
    want = sk.MinMaxScaler().fit_transform(df[["b", "k"]])
    np.testing.assert_allclose(out[["b2", "k2"]].to_numpy(), want, rtol=1e-12)
    assert (out["b"] == df["b"]).all()  # input left in place


def test_one_hot_encoder_matches_sklearn(df):
    enc = OneHotEncoder(["c", "k"]).fit(df, batch_size=128)
    out = enc.transform_batch({"c": df["c"].to_numpy(), "k": df["k"].to_numpy()})
    want = sk.OneHotEncoder(sparse_output=False).fit_transform(df[["c", "k"]])
    np.testing.assert_array_equal(np.concatenate([out["c"], out["k"]], axis=1), want)
    unseen = enc.transform_batch(pd.DataFrame({"c": ["purple"], "k": [9]}))
    assert unseen["c"].iloc[0].sum() == 0


def test_one_hot_max_categories_keeps_the_most_frequent(df):
    enc = OneHotEncoder(["c"], max_categories={"c": 2}).fit(df)
    assert list(enc.stats_["unique_values(c)"]) == ["green", "red"]


def test_ordinal_and_label_encoders_match_sklearn(df):
    out = OrdinalEncoder(["c", "k"]).fit(df, batch_size=77).transform_batch(df)
    want = sk.OrdinalEncoder().fit_transform(df[["c", "k"]])
    np.testing.assert_array_equal(out[["c", "k"]].to_numpy(), want)
    label = LabelEncoder("c").fit(df, batch_size=77)
    encoded = label.transform_batch(df)
    np.testing.assert_array_equal(encoded["c"], sk.LabelEncoder().fit_transform(df["c"]))
    assert (label.inverse_transform_batch(encoded)["c"] == df["c"]).all()


def test_ordinal_encoder_encodes_lists():
    data = pd.DataFrame({"t": [["b", "a"], ["c"], ["a"]]})
    out = OrdinalEncoder(["t"]).fit(data).transform_batch(data)
    assert out["t"].tolist() == [[1, 0], [2], [0]]


@pytest.mark.parametrize("strategy", ["mean", "most_frequent"])
def test_simple_imputer_matches_sklearn(df, strategy):
    data = df[["a"]].round(0)  # ties and repeats for most_frequent
    out = SimpleImputer(["a"], strategy).fit(data, batch_size=50).transform_batch(data)
    want = skimpute.SimpleImputer(strategy=strategy).fit_transform(data)
    np.testing.assert_allclose(out[["a"]].to_numpy(), want)


def test_simple_imputer_constant_needs_no_fit_and_fills_missing_column():
    imp = SimpleImputer(["a", "z"], "constant", fill_value=0.5)
    assert imp.fit_status() == FitStatus.NOT_FITTABLE
    out = imp.transform_batch(pd.DataFrame({"a": [1.0, None]}))
    assert out["a"].tolist() == [1.0, 0.5] and out["z"].tolist() == [0.5, 0.5]


def test_concatenator_numpy_and_pandas(df):
    cat = Concatenator(["a", "b"], output_column_name="x", dtype=np.float32)
    out = cat.transform_batch({"a": np.ones(3), "b": np.zeros(3), "k": np.arange(3)})
    assert out["x"].shape == (3, 2) and out["x"].dtype == np.float32 and set(out) == {"x", "k"}
    pdf = cat.transform_batch(df.head(4))
    np.testing.assert_array_equal(np.stack(pdf["x"]), df[["a", "b"]].head(4).to_numpy("f4"))


def test_chain_fits_each_stage_on_the_previous_output(df):
    chain = Chain(SimpleImputer(["a"]), StandardScaler(["a", "b"]), Concatenator(["a", "b"], "x"))
    assert chain.fit_status() == FitStatus.NOT_FITTED
    out = chain.fit(df, batch_size=100).transform_batch(df)
    filled = skimpute.SimpleImputer().fit_transform(df[["a"]])
    want = sk.StandardScaler().fit_transform(np.column_stack([filled, df["b"]]))
    np.testing.assert_allclose(np.stack(out["x"]), want, rtol=1e-10, atol=1e-12)
    assert chain.fit_status() == FitStatus.FITTED


def test_fit_streams_batches_and_never_materialises(df, monkeypatch):
    dataset = phalanx.data.from_pandas(df)
    seen = []
    real = type(dataset).iter_batches

    def counting(self, **kwargs):
        for batch in real(self, **kwargs):
            seen.append(len(batch))
            yield batch

    def no_materialise(*args, **kwargs):
        raise AssertionError("fit materialised the dataset")

    monkeypatch.setattr(type(dataset), "iter_batches", counting)
    monkeypatch.setattr(type(dataset), "to_pandas", no_materialise)
    monkeypatch.setattr(phalanx.data.DataIterator, "to_arrow", no_materialise)
    StandardScaler(["a", "b"]).fit(dataset, batch_size=100)
    assert seen == [100] * 10


def test_fit_and_transform_whole_datasets(df, tmp_path):
    path = tmp_path / "d.parquet"
    df.to_parquet(path)
    scaler = StandardScaler(["b"])
    out = scaler.fit_transform(str(path)).to_pandas()
    np.testing.assert_allclose(out["b"], sk.StandardScaler().fit_transform(df[["b"]])[:, 0])


def test_transform_before_fit_is_a_clear_error(df):
    with pytest.raises(PreprocessorNotFittedError, match=r"(?s)not fitted.*HINT"):
        StandardScaler(["a"]).transform_batch(df)
    with pytest.raises(PreprocessorNotFittedError):
        Chain(Concatenator(["a"]), MinMaxScaler(["b"])).transform_batch(df)


def test_missing_columns_are_named(df):
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['nope'\]"):
        StandardScaler(["a", "nope"]).fit(df)


def test_serialize_round_trip(df):
    scaler = StandardScaler(["b"]).fit(df)
    again = StandardScaler.deserialize(scaler.serialize())
    pd.testing.assert_frame_equal(again.transform_batch(df), scaler.transform_batch(df))


OLD_PICKLES = Path(__file__).parent / "old_pickles"


def test_pickles_from_before_the_module_renames_still_load(tmp_path):
    # preprocessor.pkl and the checkpoint pickles were written by the code before the modules got
    # a leading underscore: they name phalanx.preprocess.scalers, phalanx.torch.checkpoint, ...
    # A new process (nothing of phalanx imported yet) loads them as a user's script would.
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    shutil.copy(OLD_PICKLES / "preprocessor.pkl", checkpoint / "preprocessor.pkl")
    code = (
        "import pickle, sys, pandas as pd\n"
        "from phalanx import Checkpoint\n"
        f"prep = Checkpoint({str(checkpoint)!r}).get_preprocessor()\n"
        "df = pd.DataFrame({'a': [1.0, None, 3.0, 4.0], 'b': [10.0, 20.0, 30.0, 40.0],"
        " 'c': ['x', 'y', 'x', 'z']})\n"
        "out = prep.transform_batch(df)\n"
        "print([round(float(v), 4) for v in out['ab'][0]], [int(v) for v in out['c'][3]])\n"
        f"ckpt = pickle.loads(open({str(OLD_PICKLES / 'torch_checkpoint.pkl')!r}, 'rb').read())\n"
        f"tf = pickle.loads(open({str(OLD_PICKLES / 'tensorflow_checkpoint.pkl')!r}, 'rb').read())\n"
        "import phalanx.torch, phalanx.preprocess, phalanx.tensorflow\n"
        "print(type(ckpt) is phalanx.torch.TorchCheckpoint, ckpt.path)\n"
        "print(type(tf) is phalanx.tensorflow.TensorflowCheckpoint, tf.path)\n"
        "import phalanx.xgboost, phalanx.lightgbm\n"
        "for lib in ('xgboost', 'lightgbm'):\n"
        f"    old = pickle.loads(open(f'{OLD_PICKLES}/{{lib}}_checkpoint.pkl', 'rb').read())\n"
        "    print(type(old).__name__, type(old).__module__, old.path)\n"
        "print(hasattr(phalanx.preprocess, 'scalers'), hasattr(phalanx.torch, 'checkpoint'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "[-1.543, 0.0] [0, 0, 1]",
        "True /tmp/some/checkpoint",
        "True /tmp/some/tf_checkpoint",
        "XGBoostCheckpoint phalanx.xgboost._checkpoint /tmp/some/xgb_checkpoint",
        "LightGBMCheckpoint phalanx.lightgbm._checkpoint /tmp/some/lgbm_checkpoint",
        "False False",  # the old paths load pickles but are not the packages' API
    ]

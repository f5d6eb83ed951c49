"""AIR-era checkpoints, predictors and restore (Ray 2.4-2.6), as Ray's own tests ran them.

Read from Ray 2.5's ``python/ray/train/tests/test_torch_trainer.py`` (``test_torch_e2e``:
``result.checkpoint.get_model()`` on the ``TorchCheckpoint.from_model`` of a prepared, DDP-wrapped
model), ``test_torch_predictor.py`` (numpy input, dtypes, the preprocessor),
the AIR doc code of ``XGBoostTrainer`` (``__train_predict_start__``, xgboost_train_predict: a
model trained on a named column predicts a nameless numpy array) and ``test_trainer_restore.py``
(``restore`` without re-passing the training function; datasets must be passed again).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile

import numpy as np
import pytest

with contextlib.suppress(ImportError):  # lightgbm sets KMP_* variables when imported
    import lightgbm  # noqa: F401

import phalanx as train
import phalanx.data
from phalanx import Checkpoint, Result, RunConfig, ScalingConfig
from phalanx.errors import ConfigError, TrainingFailedError

torch = pytest.importorskip("torch")
from phalanx.torch import TorchCheckpoint, TorchPredictor, TorchTrainer  # noqa: E402


def run_config(tmp_path, name: str = "air") -> RunConfig:
    return RunConfig(storage_path=str(tmp_path), name=name)


def e2e_train_func(config):
    model = torch.nn.Linear(3, 1)
    if config["prepare_model"]:
        model = train.torch.prepare_model(model)
    train.report({"loss": 1.0}, checkpoint=TorchCheckpoint.from_model(model))
    train.report({"loss": 0.5}, checkpoint=TorchCheckpoint.from_model(model))


@pytest.mark.parametrize("prepare_model", [False, True])
def test_torch_e2e(tmp_path, prepare_model):
    trainer = TorchTrainer(
        e2e_train_func,
        train_loop_config={"prepare_model": prepare_model},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path),
    )
    result = trainer.fit()

    assert isinstance(result.checkpoint, TorchCheckpoint)
    model = result.checkpoint.get_model(weights_only=False)
    # The DDP wrapper is not saved: the plain module loads outside a process group.
    assert type(model) is torch.nn.Linear
    assert [type(c) for c, _ in result.best_checkpoints] == [TorchCheckpoint] * 2

    predictor = TorchPredictor.from_checkpoint(result.checkpoint, weights_only=False)
    x = np.ones((4, 3), np.float32)
    with torch.no_grad():
        want = model(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(predictor.predict(x)["predictions"], want, rtol=1e-6)

    reloaded = Result.from_path(result.path)
    assert isinstance(reloaded.checkpoint, TorchCheckpoint)
    assert reloaded.checkpoint == result.checkpoint
    assert type(reloaded.checkpoint.get_model(weights_only=False)) is torch.nn.Linear


def plain_checkpoint_func():
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "state.txt"), "w") as f:
            f.write("1")
        train.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory))


def test_a_plain_checkpoint_stays_plain(tmp_path):
    result = TorchTrainer(
        plain_checkpoint_func,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path),
    ).fit()
    assert type(result.checkpoint) is Checkpoint
    assert type(Result.from_path(result.path).checkpoint) is Checkpoint


class StepCheckpoint(Checkpoint):
    """A user's own Checkpoint subclass."""

    def step(self) -> int:
        with self.as_directory() as directory, open(f"{directory}/state.txt") as f:
            return int(f.read())


def own_class_func():
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "state.txt"), "w") as f:
            f.write("7")
        train.report({"step": 0}, checkpoint=StepCheckpoint.from_directory(directory))


def test_a_checkpoint_subclass_of_the_user_comes_back(tmp_path):
    result = TorchTrainer(
        own_class_func, scaling_config=ScalingConfig(num_workers=2), run_config=run_config(tmp_path)
    ).fit()
    assert type(result.checkpoint) is StepCheckpoint and result.checkpoint.step() == 7
    assert type(Result.from_path(result.path).checkpoint) is StepCheckpoint


def test_a_class_named_in_a_snapshot_is_never_imported(tmp_path, monkeypatch):
    import sys

    from phalanx._internal.storage.checkpoint_class import checkpoint_class

    name = "planted_checkpoint_module"  # importable: only the rule keeps it from running
    (tmp_path / f"{name}.py").write_text(
        "from phalanx import Checkpoint\nclass Planted(Checkpoint):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert checkpoint_class(f"{name}:Planted") is Checkpoint
    assert name not in sys.modules
    assert checkpoint_class("os:path") is Checkpoint  # not a Checkpoint class
    assert checkpoint_class("phalanx.torch._checkpoint:TorchCheckpoint") is TorchCheckpoint


class SquareModel(torch.nn.Module):
    def forward(self, x):
        return x * 2


class DoublingPreprocessor:
    """Ray's ``DummyPreprocessor``: remembers that it ran."""

    def __init__(self):
        self.has_preprocessed = False

    def transform_batch(self, batch):
        self.has_preprocessed = True
        return batch * 2


def test_predict_array():
    """AIR 2.4+'s ``test_predict_array``: a 1-D array keeps its shape, the output is 1-D."""
    predictions = TorchPredictor(model=SquareModel()).predict(np.asarray([1, 2, 3]))
    assert len(predictions) == 1
    np.testing.assert_array_equal(predictions["predictions"], np.asarray([2, 4, 6]))
    one_d_with_preprocessor = TorchPredictor(
        model=SquareModel(), preprocessor=DoublingPreprocessor()
    ).predict(np.array([1, 2, 3]))
    np.testing.assert_array_equal(one_d_with_preprocessor["predictions"], [4, 8, 12])


def test_predict_array_with_preprocessor():
    predictor = TorchPredictor(model=SquareModel(), preprocessor=DoublingPreprocessor())
    predictions = predictor.predict(np.array([[1], [2], [3]]))
    assert list(predictions) == ["predictions"]
    np.testing.assert_array_equal(predictions["predictions"], [[4], [8], [12]])
    assert predictor.get_preprocessor().has_preprocessed


def test_predict_array_with_preprocessor_from_the_checkpoint():
    checkpoint = TorchCheckpoint.from_state_dict({}, preprocessor=DoublingPreprocessor())
    predictor = TorchPredictor.from_checkpoint(checkpoint, model=SquareModel())
    predictions = predictor.predict(np.array([[1.0], [2.0]], np.float32))
    np.testing.assert_array_equal(predictions["predictions"], [[4.0], [8.0]])
    assert predictor.get_preprocessor().has_preprocessed


@pytest.mark.parametrize(
    ("input_dtype", "expected_output_dtype"),
    [
        (torch.float16, np.float16),
        (torch.float64, np.float64),
        (torch.int32, np.int32),
        (torch.int64, np.int64),
    ],
)
def test_predict_array_with_different_dtypes(input_dtype, expected_output_dtype):
    predictor = TorchPredictor(model=SquareModel())
    predictions = predictor.predict(np.array([[1], [2], [3]]), dtype=input_dtype)
    assert predictions["predictions"].dtype == expected_output_dtype
    np.testing.assert_array_equal(predictions["predictions"], [[2], [4], [6]])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_predict_array_of_float16_and_float64_rows(dtype):
    predictor = TorchPredictor(model=SquareModel())
    from_array = predictor.predict(np.array([[1.5], [2.5]], dtype))
    assert from_array["predictions"].dtype == dtype
    from_dict = predictor.predict({"x": np.array([[1.5], [2.5]], dtype)})
    assert isinstance(from_dict, dict) and from_dict["predictions"].dtype == dtype
    np.testing.assert_array_equal(from_dict["predictions"], [[3.0], [5.0]])


@pytest.mark.parametrize("framework", ["xgboost", "lightgbm"])
def test_xgboost_train_predict(tmp_path, framework):
    """Ray's ``xgboost_train_predict`` doc example (and its LightGBM twin): trained on column
    ``x`` with ``label_column="y"``, then a nameless numpy array predicts."""
    pytest.importorskip(framework)
    if framework == "xgboost":
        from phalanx.xgboost import XGBoostPredictor as Predictor
        from phalanx.xgboost import XGBoostTrainer as Trainer

        params = {"objective": "reg:squarederror"}
    else:
        from phalanx.lightgbm import LightGBMPredictor as Predictor
        from phalanx.lightgbm import LightGBMTrainer as Trainer

        params = {"objective": "regression", "min_data_in_leaf": 1, "verbose": -1}
    train_dataset = phalanx.data.from_items([{"x": x, "y": x + 1} for x in range(32)])
    trainer = Trainer(
        label_column="y",
        params=params,
        scaling_config=ScalingConfig(num_workers=2),
        datasets={"train": train_dataset},
        run_config=run_config(tmp_path),
    )
    result = trainer.fit()

    predictor = Predictor.from_checkpoint(result.checkpoint)
    predictions = predictor.predict(np.expand_dims(np.arange(32, 64), 1))
    assert predictions["predictions"].shape == (32,)
    by_name = predictor.predict({"x": np.arange(32, 64)})
    np.testing.assert_allclose(predictions["predictions"], by_name["predictions"])
    with pytest.raises(ValueError, match="2 columns"):
        predictor.predict(np.ones((3, 2)))


def xgboost_checkpoint_func():
    import xgboost

    x = np.arange(20, dtype=np.float64).reshape(10, 2)
    booster = xgboost.train({}, xgboost.DMatrix(x, label=x[:, 0]), 2)
    from phalanx.xgboost import XGBoostCheckpoint

    train.report({"step": 0}, checkpoint=XGBoostCheckpoint.from_model(booster))


def lightgbm_checkpoint_func():
    import lightgbm

    x = np.arange(40, dtype=np.float64).reshape(20, 2)
    data = lightgbm.Dataset(x, label=x[:, 0], params={"min_data_in_leaf": 1, "verbose": -1})
    booster = lightgbm.train({"verbose": -1}, data, 2)
    from phalanx.lightgbm import LightGBMCheckpoint

    train.report({"step": 0}, checkpoint=LightGBMCheckpoint.from_model(booster))


@pytest.mark.parametrize("framework", ["xgboost", "lightgbm"])
def test_gbdt_checkpoint_reported_comes_back_as_its_class(tmp_path, framework):
    pytest.importorskip(framework)
    import phalanx.lightgbm
    import phalanx.xgboost

    func, cls = {
        "xgboost": (xgboost_checkpoint_func, phalanx.xgboost.XGBoostCheckpoint),
        "lightgbm": (lightgbm_checkpoint_func, phalanx.lightgbm.LightGBMCheckpoint),
    }[framework]
    result = TorchTrainer(
        func, scaling_config=ScalingConfig(num_workers=2), run_config=run_config(tmp_path)
    ).fit()
    assert type(result.checkpoint) is cls
    assert type(result.checkpoint.get_model()).__module__.startswith(framework)
    assert type(Result.from_path(result.path).checkpoint) is cls


def restorable_func(config):
    shard = train.get_dataset_shard("train")
    rows = sum(len(batch["a"]) for batch in shard.iter_batches(batch_size=4))
    checkpoint = train.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as directory, open(f"{directory}/round.txt") as f:
            start = int(f.read()) + 1
    for i in range(start, config["rounds"]):
        if checkpoint is None and i == config["fail_at"]:
            raise RuntimeError("the first run dies here")
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "round.txt"), "w") as f:
                f.write(str(i))
            train.report(
                {"round": i, "rows": rows, "resumed": checkpoint is not None},
                checkpoint=Checkpoint.from_directory(directory),
            )


def datasets():
    return {
        "train": phalanx.data.from_items([{"a": i} for i in range(10)]),
        "valid": phalanx.data.from_items([{"a": i} for i in range(4)]),
    }


def failed_run(tmp_path) -> str:
    trainer = TorchTrainer(
        restorable_func,
        train_loop_config={"rounds": 3, "fail_at": 1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "restore_me"),
        datasets=datasets(),
    )
    with pytest.raises(TrainingFailedError):
        trainer.fit()
    return str(tmp_path / "restore_me")


def test_restore_with_datasets(tmp_path):
    path = failed_run(tmp_path)
    assert TorchTrainer.can_restore(path)
    with pytest.raises(ValueError, match="datasets"):
        TorchTrainer.restore(path)
    with pytest.raises(ValueError, match="valid"):
        TorchTrainer.restore(path, datasets={"train": datasets()["train"]})
    with pytest.raises(ValueError, match="invalid_key"):
        TorchTrainer.restore(path, datasets={**datasets(), "invalid_key": datasets()["train"]})

    trainer = TorchTrainer.restore(path, datasets=datasets())
    assert trainer.train_loop_config == {"rounds": 3, "fail_at": 1}
    assert trainer.scaling_config.num_workers == 2
    result = trainer.fit()
    assert result.path == path
    assert result.metrics == {"round": 2, "rows": 5, "resumed": True}
    assert list(result.metrics_dataframe["round"]) == [0, 1, 2]


def test_restore_re_specified_arguments_win(tmp_path):
    path = failed_run(tmp_path)
    trainer = TorchTrainer.restore(
        path,
        train_loop_config={"rounds": 4, "fail_at": 1},
        datasets=datasets(),
        scaling_config=ScalingConfig(num_workers=1),
    )
    result = trainer.fit()
    assert result.metrics == {"round": 3, "rows": 10, "resumed": True}


def test_trainer_can_restore_utility(tmp_path):
    assert not TorchTrainer.can_restore(str(tmp_path / "nothing_here"))
    path = failed_run(tmp_path)
    assert TorchTrainer.can_restore(path)
    with open(os.path.join(path, "trainer.pkl"), "rb") as f:
        trainer_cls, params = pickle.load(f)
    assert trainer_cls is TorchTrainer
    assert params["datasets"] == ["train", "valid"]  # only the keys: data is never saved


def test_restore_with_different_trainer(tmp_path):
    from phalanx import DataParallelTrainer

    path = failed_run(tmp_path)
    with pytest.warns(UserWarning, match="TorchTrainer.restore"):
        DataParallelTrainer.restore(path, datasets=datasets())


def test_restore_without_a_saved_trainer_asks_for_the_function(tmp_path):
    path = failed_run(tmp_path)
    os.remove(os.path.join(path, "trainer.pkl"))  # a run saved before phalanx kept it
    with pytest.raises(ConfigError, match="train_loop_per_worker"):
        TorchTrainer.restore(path, datasets=datasets())
    result = TorchTrainer.restore(
        path,
        restorable_func,
        train_loop_config={"rounds": 3, "fail_at": 1},
        datasets=datasets(),
        scaling_config=ScalingConfig(num_workers=2),
    ).fit()
    assert result.metrics["round"] == 2

"""report() checks metrics on the worker: what the history cannot hold exactly is refused there,
with the key and a HINT; numpy values become Python numbers; NaN and inf keep working."""

from __future__ import annotations

import datetime
import enum
import math

import numpy as np
import pytest

import phalanx as train
from phalanx import DataParallelTrainer, Result, RunConfig, ScalingConfig, TrainingFailedError


class Size(enum.IntEnum):
    BIG = 10


class Colour(str, enum.Enum):  # the mixin, whose str() is "Colour.RED"
    RED = "red"


def fit_reporting(metrics, storage, engine="thread"):
    def loop():
        train.report(metrics)

    return DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine=engine),
        run_config=RunConfig(name="m", storage_path=storage),
    ).fit()


@pytest.mark.slow
def test_a_tuple_key_is_refused_on_the_worker_naming_the_key(storage):
    # Before: the driver's JSON encoder raised "keys must be str" and aborted the run.
    with pytest.raises(TrainingFailedError) as info:
        fit_reporting({(1, 2): 0.5}, storage, engine="local")
    failure = info.value.worker_failures[0]
    assert failure.type_name == "ValueError"
    assert "Metric key (1, 2) is a tuple" in failure.message
    assert "HINT: use a string key, e.g. '1/2'" in failure.message


@pytest.mark.parametrize(
    ("value", "shown", "hint"),
    [
        (datetime.datetime(2024, 1, 2), "datetime.datetime", "isoformat()"),
        ({1, 2}, "builtins.set", "sorted(value)"),
        (b"\x00\x01", "builtins.bytes", "decode"),
        (object(), "builtins.object", "convert it"),
        ({"inner": {3}}, "builtins.set", "sorted(value)"),
    ],
)
def test_values_json_cannot_hold_are_refused_with_the_key_and_a_hint(value, shown, hint, storage):
    # Before: stored as repr strings, so Result.from_path gave back something else.
    with pytest.raises(TrainingFailedError) as info:
        fit_reporting({"when": value}, storage)
    message = info.value.worker_failures[0].message
    assert info.value.worker_failures[0].type_name == "ValueError"
    assert "Metric 'when" in message and shown in message
    assert "HINT: " in message and hint in message


@pytest.mark.parametrize(
    "key", ["training_iteration", "timestamp", "checkpoint_dir_name", "_phalanx_attempt"]
)
def test_reserved_keys_are_refused(key, storage):
    # Before: the user's value silently replaced phalanx's column (or the reverse).
    with pytest.raises(TrainingFailedError) as info:
        fit_reporting({key: 7}, storage)
    message = info.value.worker_failures[0].message
    assert f"Metric key {key!r} is reserved" in message and f"'my_{key}'" in message


def test_numpy_values_and_tuples_become_python_values_that_round_trip(storage):
    metrics = {
        "f32": np.float32(0.1),
        "f64": np.float64(2.5),
        "i64": np.int64(-3),
        "flag": np.bool_(True),
        "zero_d": np.array(1.25),
        "vec": np.arange(3, dtype=np.int32),
        "pair": (1, np.float32(0.5)),
        "nested": {"a": [np.int8(1), {"b": np.float16(0.25)}]},
        "nan": float("nan"),
        "np_inf": np.float32("inf"),
        "ninf": -math.inf,
        "plain": "text",
        "none": None,
        "int_enum": Size.BIG,
        "str_enum": Colour.RED,
    }
    result = fit_reporting(metrics, storage)
    expected = {
        "f32": float(np.float32(0.1)),
        "f64": 2.5,
        "i64": -3,
        "flag": True,
        "zero_d": 1.25,
        "vec": [0, 1, 2],
        "pair": [1, 0.5],
        "nested": {"a": [1, {"b": 0.25}]},
        "plain": "text",
        "none": None,
        "int_enum": 10,
        "str_enum": "red",
    }
    reloaded = Result.from_path(result.path).metrics
    for got in (result.metrics, reloaded):
        assert {k: v for k, v in got.items() if k not in ("nan", "np_inf", "ninf")} == expected
        assert type(got["f32"]) is float and type(got["i64"]) is int and type(got["flag"]) is bool
        assert type(got["int_enum"]) is int and type(got["str_enum"]) is str
        assert math.isnan(got["nan"]) and got["np_inf"] == math.inf and got["ninf"] == -math.inf


def test_report_leaves_the_users_dict_alone(storage):
    metrics = {"x": np.float32(1.5), "t": (1, 2)}
    fit_reporting(metrics, storage)
    assert type(metrics["x"]) is np.float32 and metrics["t"] == (1, 2)


def test_a_torch_tensor_is_refused_with_rays_message(storage):
    torch = pytest.importorskip("torch")
    with pytest.raises(TrainingFailedError) as info:
        fit_reporting({"loss": torch.tensor(0.5)}, storage)
    failure = info.value.worker_failures[0]
    assert failure.type_name == "ValueError"  # as Ray Train raises
    assert "Torch tensors as metrics is not supported" in failure.message
    assert "Metric 'loss'" in failure.message and ".item()" in failure.message

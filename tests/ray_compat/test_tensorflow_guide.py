"""Ray's TensorFlow/Keras guide, as a Ray user's script runs it, with phalanx imports.

Read from "Get Started with Distributed Training using TensorFlow/Keras" (Ray 2.60 docs,
https://docs.ray.io/en/latest/train/distributed-tensorflow-keras.html and its quickstart
``doc_code/tf_starter.py``): ``MultiWorkerMirroredStrategy`` built in the training function,
``get_dataset_shard("train").to_tf(...)`` fed to ``model.fit`` with ``ReportCheckpointCallback``,
``result.checkpoint`` loaded with ``TensorflowCheckpoint``. The guide's ``from_items`` data is
kept (200 rows of ``y = 2x``).
"""

from __future__ import annotations

import importlib.util

import pytest

import phalanx as train
import phalanx.data
from phalanx import RunConfig, ScalingConfig

if not all(importlib.util.find_spec(m) for m in ("tensorflow", "tf_keras")):  # no TF import
    pytest.skip("tf-keras is not installed", allow_module_level=True)
from phalanx.tensorflow import TensorflowTrainer

pytestmark = pytest.mark.slow


def build_model():
    import tensorflow as tf

    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=()),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(10),
            tf.keras.layers.Dense(1),
        ]
    )


def train_func(config: dict) -> list:
    import tensorflow as tf

    from phalanx.tensorflow import ReportCheckpointCallback

    batch_size = config.get("batch_size", 64)
    epochs = config.get("epochs", 3)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        multi_worker_model = build_model()
        multi_worker_model.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=config.get("lr", 1e-3)),
            loss=tf.keras.losses.mean_squared_error,
            metrics=[tf.keras.metrics.mean_squared_error],
        )
    dataset = train.get_dataset_shard("train")
    results = []
    for _ in range(epochs):
        tf_dataset = dataset.to_tf(feature_columns="x", label_columns="y", batch_size=batch_size)
        history = multi_worker_model.fit(tf_dataset, callbacks=[ReportCheckpointCallback()])
        results.append(history.history)
    # Not in the guide: to_tf gives this worker its whole shard, 100 of the 200 rows.
    rows = sum(len(x) for x, _ in tf_dataset.as_numpy_iterator())
    assert rows == 100, rows
    return results


def test_the_tensorflow_quickstart(storage):
    train_dataset = phalanx.data.from_items([{"x": x / 200, "y": 2 * x / 200} for x in range(200)])
    trainer = TensorflowTrainer(
        train_loop_per_worker=train_func,
        train_loop_config={"lr": 1e-3, "batch_size": 32, "epochs": 4},
        scaling_config=ScalingConfig(num_workers=2),
        datasets={"train": train_dataset},
        run_config=RunConfig(name="tf_quickstart", storage_path=storage),
    )
    result = trainer.fit()
    assert result.error is None
    history = result.metrics_dataframe
    assert len(history) == 4  # one report (and checkpoint) per fit() call
    assert history["loss"].iloc[-1] < history["loss"].iloc[0]
    assert set(history.columns) >= {"loss", "mean_squared_error"}
    metadata = result.checkpoint.get_metadata()
    assert metadata["_model_filename"] == "model.keras"

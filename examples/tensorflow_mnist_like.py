"""Ray's "Get Started with Distributed Training using TensorFlow/Keras" on phalanx.

A small dense network on MNIST-shaped synthetic data (random 28x28 "digits" labelled by a hidden
random teacher), written as a Ray Train user writes it; only the imports differ
(``ray.train.tensorflow`` -> ``phalanx.tensorflow``, ``from ray import train`` ->
``import phalanx as train``). Needs ``pip install "phalanx[tensorflow]"``.

    python examples/tensorflow_mnist_like.py             # 2 workers, 3 epochs
    python examples/tensorflow_mnist_like.py --workers 4 --epochs 5 --storage-path /tmp/runs

Each worker builds ``MultiWorkerMirroredStrategy()`` first (TensorFlow configures its
collectives only before it runs any op), trains on its own shard with ``model.fit``, and
``ReportCheckpointCallback`` reports each epoch's loss and accuracy with the model.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import numpy as np

import phalanx as train
from phalanx import RunConfig, ScalingConfig
from phalanx.tensorflow import TensorflowCheckpoint, TensorflowTrainer

ROWS_PER_WORKER = 1024


def mnist_like(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random images, labelled by the argmax of a fixed random linear teacher."""
    teacher = np.random.default_rng(1234).normal(size=(28 * 28, 10))
    x = np.random.default_rng(seed).random((rows, 28 * 28), dtype=np.float32)
    return x, np.argmax((x - 0.5) @ teacher, axis=1).astype(np.int64)


def build_model(tf: Any) -> Any:
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(28 * 28,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )


def train_func(config: dict) -> None:
    import tensorflow as tf

    from phalanx.tensorflow import ReportCheckpointCallback, prepare_dataset_shard

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # first, before any other TF op
    context = train.get_context()
    # The global batch: Keras splits each batch among all workers' replicas.
    global_batch = config["batch_size"] * context.get_world_size()
    x, y = mnist_like(ROWS_PER_WORKER, seed=context.get_world_rank())  # this worker's shard
    dataset = prepare_dataset_shard(
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(ROWS_PER_WORKER, seed=0)
        .batch(global_batch)
    )
    with strategy.scope():
        model = build_model(tf)
        model.compile(
            optimizer=tf.keras.optimizers.Adam(config["lr"]),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    model.fit(dataset, epochs=config["epochs"], verbose=0, callbacks=[ReportCheckpointCallback()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()
    storage = args.storage_path or tempfile.mkdtemp(prefix="phalanx_tf_")
    result = TensorflowTrainer(
        train_func,
        train_loop_config={"lr": 3e-3, "batch_size": 32, "epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(name="tensorflow_mnist_like", storage_path=storage),
    ).fit()
    print(result.metrics_dataframe[["loss", "accuracy"]].to_string())
    checkpoint = TensorflowCheckpoint.from_checkpoint(result.checkpoint)
    print("checkpoint:", checkpoint.path, checkpoint.get_metadata())


if __name__ == "__main__":
    main()

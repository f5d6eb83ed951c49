"""phalanx.tensorflow: TF_CONFIG, Keras model.fit on 2 workers, checkpoints and resume.

TensorFlow is imported only inside the workers (and in subprocesses): the driver forks its
workers, and a driver that ran TensorFlow would hand them its runtime's state.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import phalanx
from phalanx import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

if not all(importlib.util.find_spec(m) for m in ("tensorflow", "tf_keras")):  # no TF import
    pytest.skip("tf-keras is not installed", allow_module_level=True)

from phalanx.tensorflow import TensorflowCheckpoint, TensorflowConfig, TensorflowTrainer

GLOBAL_BATCH = 8
STEPS = 4  # per epoch
EPOCHS = 2


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]], dtype="float32") + 0.3).astype("float32")
    return x, y


def _fit(config: dict) -> None:
    """Both the reference (one process, no strategy, global batch) and the 2-worker run (each
    rank: its half of every global batch, MultiWorkerMirroredStrategy)."""
    import tensorflow as tf

    from phalanx.tensorflow import ReportCheckpointCallback, prepare_dataset_shard

    ctx = phalanx.get_context()
    rank, n = ctx.get_world_rank(), ctx.get_world_size()
    # First: TensorFlow configures collectives only before its runtime runs any op.
    strategy = (
        tf.distribute.MultiWorkerMirroredStrategy()
        if config["distributed"]
        else tf.distribute.get_strategy()
    )
    x, y = _data()
    per_rank = GLOBAL_BATCH // n
    # Global batch i is rows [8i, 8i+8): rank r takes the r-th part of each.
    x = x.reshape(STEPS, n, per_rank, 3)[:, rank].reshape(-1, 3)
    y = y.reshape(STEPS, n, per_rank, 1)[:, rank].reshape(-1, 1)
    # Keras under MultiWorkerMirroredStrategy splits each batch among all replicas: batched by
    # the global size, each step takes this rank's next per_rank rows. prepare_dataset_shard
    # makes Keras read the whole shard (it would stop halfway on a dataset of known length).
    dataset = prepare_dataset_shard(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))
    policy = dataset.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.OFF
    assert strategy.num_replicas_in_sync == n
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(3,)),
                tf.keras.layers.Dense(4, activation="tanh"),
                tf.keras.layers.Dense(1),
            ]
        )
        model.set_weights(
            [np.full(w.shape, 0.1 * (i + 1), "float32") for i, w in enumerate(model.get_weights())]
        )
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    model.fit(
        dataset,
        epochs=EPOCHS,
        verbose=0,
        callbacks=[
            ReportCheckpointCallback(
                metrics={"train_loss": "loss"}, report_metrics_on=["train_batch_end", "epoch_end"]
            )
        ],
    )
    np.savez(os.path.join(config["out"], f"rank{rank}.npz"), *model.get_weights())


def _weights(path: str) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


@pytest.mark.slow
def test_keras_fit_on_two_workers_matches_one_process_with_the_global_batch(tmp_path, storage):
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        out.mkdir()
        runs[workers] = TensorflowTrainer(
            _fit,
            train_loop_config={"distributed": workers > 1, "out": str(out)},
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(name=f"tf{workers}", storage_path=storage),
        ).fit()
    reference = _weights(str(tmp_path / "out1" / "rank0.npz"))
    for rank in (0, 1):
        weights = _weights(str(tmp_path / "out2" / f"rank{rank}.npz"))
        for got, want in zip(weights, reference, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(reference[0], 0.1)  # it did train

    result = runs[2]
    history = result.metrics_dataframe  # every batch's loss, then the epoch's with a checkpoint
    assert len(history) == EPOCHS * (STEPS + 1)
    assert result.metrics["train_loss"] < history["train_loss"].iloc[0]
    assert len(result.best_checkpoints) == EPOCHS
    with result.checkpoint.as_directory() as directory:
        assert os.path.isfile(os.path.join(directory, "model.keras"))
    assert (
        TensorflowCheckpoint.from_checkpoint(result.checkpoint).get_metadata()[
            TensorflowCheckpoint.MODEL_FILENAME_KEY
        ]
        == "model.keras"
    )


def _resumable(config: dict) -> None:
    """4 epochs, a checkpoint each; rank 1 is SIGKILLed at the start of epoch 3 of attempt 1.
    The retry loads the last checkpoint's model (optimizer state included) and goes on."""
    import tensorflow as tf

    from phalanx.tensorflow import ReportCheckpointCallback, prepare_dataset_shard

    rank = phalanx.get_context().get_world_rank()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = _data()
    dataset = prepare_dataset_shard(
        tf.data.Dataset.from_tensor_slices((x[rank::2], y[rank::2])).batch(GLOBAL_BATCH)
    )
    checkpoint = phalanx.get_checkpoint()
    with strategy.scope():
        if checkpoint is None:
            model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(1)])
            model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
        else:
            model = TensorflowCheckpoint.from_checkpoint(checkpoint).get_model()
    start = int(model.optimizer.iterations.numpy()) // STEPS
    with open(os.path.join(config["out"], f"starts{rank}"), "a") as f:
        f.write(f"{start}\n")

    class Kill(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if rank == 1 and epoch == 2 and checkpoint is None:
                os.kill(os.getpid(), signal.SIGKILL)

    model.fit(
        dataset,
        epochs=4,
        initial_epoch=start,
        verbose=0,
        callbacks=[Kill(), ReportCheckpointCallback()],
    )


@pytest.mark.slow
def test_checkpoints_from_keras_resume_after_a_worker_is_killed(tmp_path, storage):
    result = TensorflowTrainer(
        _resumable,
        train_loop_config={"out": str(tmp_path)},
        tensorflow_config=TensorflowConfig(),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="tf_resume",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    ).fit()
    assert result.error is None
    for rank in (0, 1):
        assert (tmp_path / f"starts{rank}").read_text().split() == ["0", "2"]
    assert len(result.best_checkpoints) == 2
    history = result.metrics_dataframe
    assert len(history) == 4 and np.isfinite(history["loss"]).all()


def test_import_phalanx_imports_no_tensorflow_and_a_missing_one_names_the_extra():
    code = (
        "import sys, phalanx\n"
        "assert 'tensorflow' not in sys.modules\n"
        "import phalanx.tensorflow\n"
        "assert 'tensorflow' not in sys.modules, 'phalanx.tensorflow imported it eagerly'\n"
        "for name in list(sys.modules):\n"
        "    if name.startswith('phalanx.tensorflow'): del sys.modules[name]\n"
        "sys.modules['tensorflow'] = None\n"
        "try:\n"
        "    import phalanx.tensorflow\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert 'pip install "phalanx[tensorflow]"' in out.stdout, out.stdout + out.stderr


def test_tf_config_of_each_rank_names_every_worker(storage):
    def report_tf_config():
        phalanx.report(
            {"tf_config": os.environ["TF_CONFIG"], "legacy": os.environ["TF_USE_LEGACY_KERAS"]}
        )

    result = TensorflowTrainer(
        report_tf_config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="tf_config", storage_path=storage),
    ).fit()
    tf_config = json.loads(result.metrics["tf_config"])
    workers = tf_config["cluster"]["worker"]
    assert len(set(workers)) == 2 and all(w.startswith("127.0.0.1:") for w in workers)
    assert tf_config["task"] == {"type": "worker", "index": 0}
    assert result.metrics["legacy"] == "1"


DRIVER_ON_KERAS_3 = """
import sys
import tensorflow as tf
import phalanx
from phalanx.tensorflow import TensorflowTrainer

assert tf.keras.__name__.startswith("keras"), tf.keras.__name__  # Keras 3 bound in the driver

def train_func():
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices(([[1.0, 2.0]] * 8, [[1.0]] * 8)).batch(4)
    model.fit(data, epochs=1, verbose=0)
    phalanx.report({"keras": tf.keras.__name__})

result = TensorflowTrainer(
    train_func,
    scaling_config=phalanx.ScalingConfig(num_workers=2),
    run_config=phalanx.RunConfig(name="keras3_driver", storage_path=sys.argv[1]),
).fit()
print("KERAS", result.metrics["keras"])
"""


@pytest.mark.slow
def test_workers_of_a_driver_that_used_keras_3_train_with_keras_2(tmp_path):
    """The driver's tf.keras resolved to Keras 3 (a script that used it before fit(), or a
    library that did, e.g. importing ray.train.tensorflow); forked workers must not keep it."""
    out = subprocess.run(
        [sys.executable, "-c", DRIVER_ON_KERAS_3, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "KERAS tf_keras" in out.stdout, out.stdout

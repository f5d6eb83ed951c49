"""phalanx.tensorflow: multi-worker TensorFlow / Keras (Ray Train's ``ray.train.tensorflow``).

``TensorflowTrainer`` runs your training function on every worker with ``TF_CONFIG`` set, so
``tf.distribute.MultiWorkerMirroredStrategy()`` built inside it joins all workers into one
cluster; ``ReportCheckpointCallback`` reports Keras logs (and the model, as a
``TensorflowCheckpoint``) from ``model.fit``; ``prepare_dataset_shard`` readies a ``tf.data``
dataset that phalanx already sharded.

TensorFlow itself is imported lazily (on the workers, or when you call something that needs it):
``import phalanx.tensorflow`` on the driver costs no TensorFlow start-up.

Example::

    import phalanx as train
    from phalanx.tensorflow import ReportCheckpointCallback, TensorflowTrainer

    def train_func(config):
        import tensorflow as tf
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = build_model()
            model.compile(optimizer="sgd", loss="mse")
        model.fit(dataset, epochs=3, callbacks=[ReportCheckpointCallback()])

    TensorflowTrainer(train_func, scaling_config=train.ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

import typing as _typing

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra(
    "phalanx.tensorflow", "tensorflow", "numpy", "pyarrow", extra="tensorflow"
):
    raise _missing

from phalanx._foundation.module_aliases import keep_old_module_paths as _keep_old_paths
from phalanx.tensorflow._checkpoint import TensorflowCheckpoint
from phalanx.tensorflow._config import TensorflowConfig
from phalanx.tensorflow._data import prepare_dataset_shard
from phalanx.tensorflow._trainer import TensorflowTrainer

# A TensorflowCheckpoint pickled before the module was renamed names this path.
_keep_old_paths(__name__, ["checkpoint"])

if _typing.TYPE_CHECKING:  # for type checkers and the API reference; imported on use below
    from phalanx.tensorflow.keras import ReportCheckpointCallback

__all__ = [
    "ReportCheckpointCallback",
    "TensorflowCheckpoint",
    "TensorflowConfig",
    "TensorflowTrainer",
    "prepare_dataset_shard",
]


def __getattr__(name: str) -> _typing.Any:  # a lazily imported class (it imports TensorFlow)
    # The callback subclasses Keras' Callback: defining it imports TensorFlow, so only on use.
    if name == "ReportCheckpointCallback":
        from phalanx.tensorflow.keras import ReportCheckpointCallback

        return ReportCheckpointCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

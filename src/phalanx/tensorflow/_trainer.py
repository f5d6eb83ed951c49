"""TensorflowTrainer: data-parallel TensorFlow / Keras training on phalanx workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.tensorflow._backend import THREAD_ENGINE_MESSAGE
from phalanx.tensorflow._config import TensorflowConfig
from phalanx.trainer import DataParallelTrainer
from phalanx.validation import ValidationConfig

__all__ = ["TensorflowTrainer"]


class TensorflowTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on every worker with ``TF_CONFIG`` describing the group.

    Before the function starts, every worker has ``TF_CONFIG`` (all workers' addresses, its own
    index = its world rank) and ``TF_USE_LEGACY_KERAS=1`` (unless you set it): build
    ``tf.distribute.MultiWorkerMirroredStrategy()`` in the function and every worker joins one
    cluster, with ``tf.keras`` being Keras 2 (``tf-keras``), which supports it. Give each worker
    its share of the global batch. See :class:`TensorflowConfig`.

    Example::

        def train_func(config):
            import tensorflow as tf
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            with strategy.scope():
                model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
                model.compile(optimizer="sgd", loss="mse")
            model.fit(x, y, batch_size=config["batch_size"],
                      callbacks=[ReportCheckpointCallback()])

        result = TensorflowTrainer(
            train_func, train_loop_config={"batch_size": 32},
            scaling_config=ScalingConfig(num_workers=2),
        ).fit()
    """

    _default_backend_config: Callable[[], TensorflowConfig] = TensorflowConfig

    def __init__(
        self,
        train_loop_per_worker: Callable[..., object],
        *,
        train_loop_config: dict[str, Any] | None = None,
        tensorflow_config: TensorflowConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        dataset_config: DataConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        validation_config: ValidationConfig | None = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
    ) -> None:
        if tensorflow_config is not None and not isinstance(tensorflow_config, TensorflowConfig):
            raise ConfigError(
                f"tensorflow_config={tensorflow_config!r} is invalid: it must be a "
                "phalanx.tensorflow.TensorflowConfig.\nHINT: from phalanx.tensorflow import "
                "TensorflowConfig (not from ray.train.tensorflow)."
            )
        if scaling_config is not None and scaling_config.engine == "thread":
            raise ConfigError(THREAD_ENGINE_MESSAGE)
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=tensorflow_config or TensorflowConfig(),
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            metadata=metadata,
            validation_config=validation_config,
        )

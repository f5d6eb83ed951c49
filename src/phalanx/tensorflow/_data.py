"""prepare_dataset_shard: a ``tf.data`` dataset phalanx already sharded, ready for Keras."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["prepare_dataset_shard"]


def prepare_dataset_shard(tf_dataset_shard: object) -> tf.data.Dataset:
    """``tf_dataset_shard`` with TensorFlow's auto-sharding turned off and prefetching on.

    Use it on a dataset made from this worker's own shard (``phalanx.get_dataset_shard(...)``
    turned into ``tf.data``, or any per-worker data): ``MultiWorkerMirroredStrategy`` would
    otherwise shard it again across workers, and each worker would train on a fraction of its
    fraction. Returns a ``tf.data.Dataset``.

    Batch sizes: under ``MultiWorkerMirroredStrategy``, Keras splits every batch of this dataset
    among all workers' replicas, so each worker's batch size is the *global* batch size of a
    step (batch by ``global_batch_size``; each worker then takes ``global / num_workers`` rows
    of its own shard per step). The result has an unknown length, so ``model.fit`` reads the
    whole shard every epoch (with a known length Keras would stop after ``1/num_workers`` of it).

    Example::

        shard = phalanx.get_dataset_shard("train")
        dataset = prepare_dataset_shard(shard.to_tf("x", "y", batch_size=64))
        model.fit(dataset, epochs=3)
    """
    import tensorflow as tf

    if not isinstance(tf_dataset_shard, tf.data.Dataset):
        raise TypeError(
            f"prepare_dataset_shard() takes a tf.data.Dataset, got "
            f"{type(tf_dataset_shard).__name__}.\nHINT: build one first, e.g. with "
            "tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)."
        )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf_dataset_shard.with_options(options)
    if dataset.cardinality() >= 0:
        # Under MultiWorkerMirroredStrategy Keras splits each batch among all replicas but
        # counts steps from the batches before the split: with a known length it would stop
        # after 1/num_workers of this shard. An unknown length makes it read the shard to the end
        # (as it does for Ray Data's shards).
        dataset = dataset.filter(_keep)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _keep(*_: object) -> tf.Tensor:
    import tensorflow as tf

    return tf.constant(True)

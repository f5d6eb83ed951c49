"""prepare_dataset_shard: a ``tf.data`` dataset phalanx already sharded, ready for Keras."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

__all__ = ["prepare_dataset_shard", "to_tf"]


def prepare_dataset_shard(tf_dataset_shard: Any) -> Any:
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


def _keep(*_: Any) -> Any:
    import tensorflow as tf

    return tf.constant(True)


def to_tf(
    passes: Callable[[], Iterable[dict[str, Any]]],
    schema: pa.Schema,
    columns: tuple[str | list[str], str | list[str], str | list[str] | None],
    specs: tuple[Any, Any, Any],
) -> Any:
    """A ``tf.data.Dataset`` of ``(features, labels[, additional])`` batches read from
    ``passes()`` (a new epoch each time TensorFlow iterates it); what ``DataIterator.to_tf``
    returns."""
    import tensorflow as tf

    groups = [c for c in columns if c is not None]
    missing = sorted({n for c in groups for n in _names(c)} - set(schema.names))
    if missing:
        raise ValueError(
            f"to_tf(): the dataset has no column(s) {missing} (it has {schema.names}).\n"
            "HINT: check feature_columns / label_columns / additional_columns."
        )
    signature = tuple(
        spec if spec is not None else _spec(schema, c)
        for c, spec in zip(columns, specs)
        if c is not None
    )

    def generate() -> Iterator[tuple[Any, ...]]:
        for batch in passes():
            yield tuple(_pick(batch, c) for c in groups)

    options = tf.data.Options()
    # Already this worker's shard: MultiWorkerMirroredStrategy must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return dataset.with_options(options)


def _names(columns: str | list[str]) -> list[str]:
    return [columns] if isinstance(columns, str) else list(columns)


def _pick(batch: dict[str, Any], columns: str | list[str]) -> Any:
    return batch[columns] if isinstance(columns, str) else {c: batch[c] for c in columns}


def _spec(schema: pa.Schema, columns: str | list[str]) -> Any:
    if isinstance(columns, str):
        return _column_spec(schema.field(columns))
    return {c: _column_spec(schema.field(c)) for c in columns}


def _column_spec(field: pa.Field) -> Any:
    """A column's TensorSpec: a batch of scalars, or of lists (a 2-D batch)."""
    import tensorflow as tf

    kind, shape = field.type, [None]
    while (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    ):
        kind, shape = kind.value_type, [*shape, None]
    dtype = (
        tf.string
        if pa.types.is_string(kind) or pa.types.is_binary(kind)
        else kind.to_pandas_dtype()
    )
    return tf.TensorSpec(shape=shape, dtype=dtype)

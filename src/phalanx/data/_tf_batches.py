"""TensorFlow batches (imported only by ``DataIterator.to_tf``), as Ray Data keeps ``to_tf`` in
its data package: ``tensorflow`` itself is imported on the first call, and ``phalanx.data`` never
imports ``phalanx.tensorflow`` (whose ``prepare_dataset_shard`` works on any ``tf.data`` dataset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

__all__ = ["to_tf"]


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


def _pick(batch: Mapping[str, object], columns: str | list[str]) -> Any:
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

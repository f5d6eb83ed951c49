"""A trainer's ``preprocessor=``: fitted on the train dataset, applied as workers read.

The driver fits the preprocessor once (streaming over the train dataset), then every dataset
shard a worker reads passes through ``transform_batch`` block by block, in the worker, so the
data is never materialised transformed. The fitted preprocessor is saved in every checkpoint
(``preprocessor.pkl``), where predictors find it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import cloudpickle
import pyarrow as pa

from phalanx._foundation.checkpoint_files import PREPROCESSOR_FILE as PREPROCESSOR_FILENAME
from phalanx.data._iterator import DataIterator
from phalanx.data._plan import Piece
from phalanx.data._source import Source
from phalanx.errors import ConfigError

if TYPE_CHECKING:
    from phalanx.preprocess._base import Preprocessor

__all__ = ["PREPROCESSOR_FILENAME", "fit_on_train", "preprocess_shards", "serialize"]


class PreprocessedSource(Source):
    """The rows of ``inner`` passed through a fitted preprocessor (row counts are unchanged)."""

    def __init__(self, inner: Source, preprocessor: Preprocessor) -> None:
        self.inner = inner
        self.preprocessor = preprocessor
        self.fragment_rows = inner.fragment_rows
        self._schema: pa.Schema | None = None

    @property  # type: ignore[override]  # Source's is a plain attribute; read on first use here
    def schema(self) -> pa.Schema:
        if self._schema is None:
            self._schema = self._transform(self._sample()).schema
        return self._schema

    def _sample(self) -> pa.RecordBatch:
        for index, rows in enumerate(self.inner.fragment_rows):
            if rows > 0:
                return next(iter(self.inner.read(Piece(index, 0, 1), 1)))
        return pa.RecordBatch.from_pylist([], schema=self.inner.schema)

    def _transform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        out = self.preprocessor.transform_batch(batch.to_pandas())
        return pa.RecordBatch.from_pandas(out, preserve_index=False)

    def read(self, piece: Piece, batch_rows: int) -> Iterator[pa.RecordBatch]:
        schema = self.schema
        for batch in self.inner.read(piece, batch_rows):
            out = self._transform(batch)
            yield out if out.schema.equals(schema) else out.cast(schema)

    def subset(self, fragments: Sequence[int]) -> Source:
        return PreprocessedSource(self.inner.subset(fragments), self.preprocessor)

    def describe(self) -> str:
        return f"{self.inner.describe()}, through {type(self.preprocessor).__name__}"


def fit_on_train(preprocessor: Preprocessor, datasets: dict[str, object]) -> None:
    """Fit ``preprocessor`` on ``datasets["train"]`` unless it is fitted already."""
    from phalanx.data import as_dataset

    status = getattr(preprocessor, "fit_status", None)
    if callable(status) and str(status()) in ("FITTED", "NOT_FITTABLE"):
        return
    if "train" not in datasets:
        raise ConfigError(
            f"preprocessor= needs a dataset named 'train' to be fitted on; the trainer got "
            f"{sorted(datasets) or 'no datasets'}.\nHINT: name your training data 'train', or "
            "pass a preprocessor that is fitted already."
        )
    train = datasets["train"]
    preprocessor.fit(as_dataset(train() if callable(train) else train))


def preprocess_shards(
    shards: list[dict[str, object]], preprocessor: Preprocessor
) -> list[dict[str, object]]:
    """Each rank's shards, reading through ``preprocessor``."""
    return [{name: _wrap(it, preprocessor) for name, it in rank.items()} for rank in shards]


def _wrap(iterator: object, preprocessor: Preprocessor) -> object:
    map_parts = getattr(iterator, "map_parts", None)
    if map_parts is not None:  # a Dataset.mix shard: each source read through it
        return map_parts(lambda part: _wrap(part, preprocessor))
    if isinstance(iterator, DataIterator):
        wrapped = DataIterator(
            PreprocessedSource(iterator._source, preprocessor), iterator._assignment
        )
        wrapped.limit_prefetch_bytes(iterator._prefetch_bytes)
        return wrapped
    return iterator  # e.g. a Ray Data iterator: transformed by Ray, not here


def check_preprocessor(preprocessor: object) -> None:
    """At the trainer's construction: a preprocessor, and one that can be saved in checkpoints
    (found now rather than when the first checkpoint is written, after training)."""
    if not (
        callable(getattr(preprocessor, "fit", None))
        and callable(getattr(preprocessor, "transform_batch", None))
    ):
        raise ConfigError(
            f"preprocessor={preprocessor!r} is invalid: it must be a phalanx.preprocess "
            "Preprocessor (with fit and transform_batch)."
        )
    serialize(preprocessor)


def serialize(preprocessor: object) -> bytes:
    """The preprocessor cloudpickled (functions and lambdas in it included), or ConfigError."""
    try:
        return cloudpickle.dumps(preprocessor)
    except Exception as exc:
        raise ConfigError(
            f"preprocessor={type(preprocessor).__name__} cannot be pickled, so it cannot be "
            f"saved in checkpoints: {type(exc).__name__}: {exc}.\nHINT: keep open files, "
            "locks, sockets and live models out of the preprocessor (build them inside the "
            "function that uses them)."
        ) from exc

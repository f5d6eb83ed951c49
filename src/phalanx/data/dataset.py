"""Dataset: a description of where rows are and how to read them; cheap to create and to pickle.

``datasets={"train": X}`` accepts a :class:`Dataset` or anything :func:`as_dataset` turns into
one; the constructors here (``read_parquet``, ``from_pandas``, ...) carry options a bare value
cannot (columns, the file shuffle).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from phalanx.data.files import file_source
from phalanx.data.iterator import Assignment, DataIterator
from phalanx.data.plan import pieces_in_range, rank_range
from phalanx.data.source import Source, TableSource

__all__ = [
    "Dataset",
    "from_arrow",
    "from_items",
    "from_numpy",
    "from_pandas",
    "read_csv",
    "read_json",
    "read_parquet",
]


class Dataset:
    """Rows to train on: split across workers by the trainer, or read whole.

    Example::

        ds = phalanx.data.read_parquet("s3://bucket/train/", columns=["x", "y"], shuffle="files")
        trainer = DataParallelTrainer(train_func, datasets={"train": ds}, ...)
    """

    def __init__(self, source: Source, *, shuffle_files: bool = False, seed: int | None = None):
        self._source = source
        self._shuffle_files = shuffle_files
        self._seed = seed

    @property
    def source(self) -> Source:
        return self._source

    def count(self) -> int:
        return self._source.num_rows

    def schema(self) -> pa.Schema:
        return self._source.schema

    def columns(self) -> list[str]:
        return list(self._source.schema.names)

    def randomize_block_order(self, seed: int | None = None) -> Dataset:
        """The same rows, with the fragments (Parquet row groups, files, blocks of in-memory
        rows) read in a new seeded order every epoch, identically on every rank."""
        return Dataset(self._source, shuffle_files=True, seed=seed)

    def iterator(self) -> DataIterator:
        """One iterator over every row."""
        return self.streaming_split(1, equal=False)[0]

    def streaming_split(self, n: int, *, equal: bool = True) -> list[DataIterator]:
        """``n`` disjoint shards covering the rows. ``equal=True``: each has ``count() // n``
        rows, and the last ``count() % n`` rows (of each epoch's order) are left out."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n={n!r} is invalid: use a positive int.")
        source, total = self._source, self._source.num_rows
        if self._shuffle_files:
            seed = self._seed if self._seed is not None else secrets.randbits(63)
            return [
                DataIterator(source, Assignment(seed=seed, rank=r, world_size=n, equal=equal))
                for r in range(n)
            ]
        shards = []
        for rank in range(n):
            start, stop = rank_range(total, rank, n, equal)
            pieces = pieces_in_range(source.fragment_rows, start, stop)
            subset, local = source.restrict(pieces)
            shards.append(DataIterator(subset, Assignment(local)))
        return shards

    def iter_batches(self, **kwargs: Any) -> Iterator[Any]:
        return self.iterator().iter_batches(**kwargs)

    def iter_torch_batches(self, **kwargs: Any) -> Iterator[Any]:
        return self.iterator().iter_torch_batches(**kwargs)

    def to_pandas(self) -> Any:
        return self.iterator().to_pandas()

    def __repr__(self) -> str:
        shuffle = ", shuffle_files=True" if self._shuffle_files else ""
        return f"Dataset({self._source.describe()}, columns={self.columns()}{shuffle})"


def read_parquet(
    paths: Any,
    *,
    filesystem: Any = None,
    columns: Sequence[str] | None = None,
    shuffle: str | None = None,
    seed: int | None = None,
) -> Dataset:
    """Parquet files or folders (local paths or URIs; ``filesystem``: an fsspec or pyarrow
    filesystem). Workers read only the row groups of their shard. ``shuffle="files"``: a new
    seeded order of the row groups every epoch."""
    source = file_source(
        paths, label="read_parquet", format="parquet", filesystem=filesystem, columns=columns
    )
    return _with_shuffle(source, shuffle, seed)


def read_csv(
    paths: Any,
    *,
    filesystem: Any = None,
    columns: Sequence[str] | None = None,
    shuffle: str | None = None,
    seed: int | None = None,
) -> Dataset:
    """CSV files or folders (with a header line; ``.gz``/``.bz2``/``.zst`` read as such)."""
    source = file_source(
        paths, label="read_csv", format="csv", filesystem=filesystem, columns=columns
    )
    return _with_shuffle(source, shuffle, seed)


def read_json(
    paths: Any,
    *,
    filesystem: Any = None,
    columns: Sequence[str] | None = None,
    shuffle: str | None = None,
    seed: int | None = None,
) -> Dataset:
    """JSON-lines files or folders (one object per line)."""
    source = file_source(
        paths, label="read_json", format="json", filesystem=filesystem, columns=columns
    )
    return _with_shuffle(source, shuffle, seed)


def from_arrow(table: pa.Table) -> Dataset:
    return Dataset(TableSource(table))


def from_pandas(df: Any) -> Dataset:
    return Dataset(TableSource(pa.Table.from_pandas(df, preserve_index=False)))


def from_numpy(arrays: np.ndarray | dict[str, Any]) -> Dataset:
    """A dict of equal-length arrays (one column each), or one array (column ``"data"``).
    Arrays with more than one dimension become tensor columns, given back with their shape."""
    if isinstance(arrays, np.ndarray):
        arrays = {"data": arrays}
    return Dataset(TableSource(pa.table({k: _to_arrow_column(v) for k, v in arrays.items()})))


def from_items(items: list[dict[str, Any]]) -> Dataset:
    return Dataset(TableSource(pa.Table.from_pylist(items)))


def _to_arrow_column(values: Any) -> pa.Array:
    array = np.asarray(values)
    if array.ndim > 1:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(array))
    return pa.array(array)


def _with_shuffle(source: Source, shuffle: str | None, seed: int | None) -> Dataset:
    if shuffle not in (None, "files"):
        raise ValueError(f"shuffle={shuffle!r} is invalid: use None or 'files'.")
    return Dataset(source, shuffle_files=shuffle == "files", seed=seed)

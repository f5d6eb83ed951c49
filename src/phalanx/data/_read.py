"""The file readers: ``read_parquet``, ``read_csv``, ``read_json`` (a :class:`Dataset` over
files or folders, local or remote, optionally with a seeded file shuffle per epoch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from phalanx.data._dataset import Dataset
from phalanx.data._files import file_source
from phalanx.data._source import Source

__all__ = ["read_csv", "read_json", "read_parquet"]


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
    seeded order of the row groups every epoch.

    Example::

        train = phalanx.data.read_parquet("s3://bucket/train/", shuffle="files", seed=0)
        TorchTrainer(train_func, datasets={"train": train}, ...)
    """
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
    """CSV files or folders (with a header line; ``.gz``/``.bz2``/``.zst`` read as such).

    Example::

        dataset = phalanx.data.read_csv(["data/a.csv", "data/b.csv.gz"], columns=["x", "y"])
    """
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
    """JSON-lines files or folders (one object per line).

    Example::

        dataset = phalanx.data.read_json("logs/", shuffle="files", seed=1)
    """
    source = file_source(
        paths, label="read_json", format="json", filesystem=filesystem, columns=columns
    )
    return _with_shuffle(source, shuffle, seed)


def _with_shuffle(source: Source, shuffle: str | None, seed: int | None) -> Dataset:
    if shuffle not in (None, "files"):
        raise ValueError(f"shuffle={shuffle!r} is invalid: use None or 'files'.")
    return Dataset(source, shuffle_files=shuffle == "files", seed=seed)

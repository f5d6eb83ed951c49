"""Data in files: find them (local or any fsspec/pyarrow filesystem), check them, read pieces.

Parquet fragments are row groups, so a worker reads only the row groups that hold its rows.
CSV and JSON-lines fragments are whole files (each file's rows are counted once, on the driver,
and cached); a worker streams its files and skips to its rows.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from phalanx._foundation.fs.access import resolve_filesystem
from phalanx.data._plan import Piece
from phalanx.data._source import Source, slice_stream
from phalanx.data._text import open_text_reader, scan_text_file, unify_text_schemas
from phalanx.errors import ConfigError

__all__ = ["FileList", "ParquetSource", "TextSource", "discover", "file_source"]

EXTENSIONS = {
    "parquet": (".parquet", ".parq", ".pq"),
    "csv": (".csv",),
    "json": (".json", ".jsonl", ".ndjson"),
}
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".lz4")
DECODE_THREADS = (
    len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
) >= 4
"""Decode Parquet columns on pyarrow's threads only with cores to spare: on small machines the
threads cost more than they give (and training workers share the cores)."""


@dataclass(frozen=True)
class FileList:
    filesystem: pafs.FileSystem  # used to read; picklable
    files: list[str]
    format: str
    where: str  # the paths as given, for messages


def file_source(
    paths: object,
    *,
    label: str,
    format: str | None = None,
    filesystem: object = None,
    columns: Sequence[str] | None = None,
    file_constants: list[dict[str, Any]] | None = None,
    constant_schema: pa.Schema | None = None,
) -> Source:
    """A Parquet, CSV or JSON-lines source over the files at ``paths`` (files or folders)."""
    found = discover(paths, label=label, format=format, filesystem=filesystem)
    if found.format == "parquet":
        return ParquetSource.scan(found, label, columns, file_constants, constant_schema)
    return TextSource.scan(found, label, columns)


def discover(paths: Any, *, label: str, format: str | None, filesystem: Any = None) -> FileList:
    """Every data file under ``paths``: folders are searched recursively, skipping hidden files
    (``.name``, ``_SUCCESS``) and files of other formats (``README.md``); files named
    explicitly are all read. Every file must be of one format."""
    given = [os.fspath(p) for p in ([paths] if isinstance(paths, str | os.PathLike) else paths)]
    if not given:
        raise ConfigError(f"{label} is an empty list of paths.")
    fs, found = None, []  # (path, named explicitly)
    for path in given:
        path_fs, stripped = resolve_filesystem(path, filesystem)
        if fs is not None and type(path_fs) is not type(fs):
            raise ConfigError(
                f"{label} mixes filesystems ({given[0]!r} and {path!r}).\n"
                "HINT: pass paths on one filesystem, or one dataset per filesystem."
            )
        fs = path_fs
        found += _expand(fs, stripped, path, label)
    assert fs is not None
    read_fs = filesystem if isinstance(filesystem, pafs.FileSystem) else _to_arrow_fs(fs)
    fmt = _format_of([f for f, _ in found], given, label, format)
    files = [f for f, explicit in found if explicit or _is_of_format(f, fmt, format is not None)]
    if not files:
        raise ConfigError(f"{label}: {', '.join(given)} holds no {fmt} files.")
    return FileList(read_fs, files, fmt, ", ".join(given))


def _is_of_format(path: str, fmt: str, named: bool) -> bool:
    """A file found in a folder is read if its extension says ``fmt``, or, when the format was
    named (``read_parquet``), if it has no extension at all (``part-00000``)."""
    kind = _format_of_name(path)
    if kind is not None:
        return kind == fmt
    return named and "." not in _strip_compression(path.rsplit("/", 1)[-1])


def _expand(fs: Any, path: str, given: str, label: str) -> list[tuple[str, bool]]:
    if not fs.exists(path):
        raise ConfigError(
            f"{label}: the path {given!r} does not exist.\n"
            "HINT: check the path (a relative path is relative to the driver's working "
            f"directory, {os.getcwd()}), or pass a URI such as s3://bucket/folder."
        )
    if not fs.isdir(path):
        return [(path, True)]
    root = path.rstrip("/")
    files = sorted(
        f
        for f in fs.find(root)
        if not any(part.startswith((".", "_")) for part in f[len(root) :].split("/") if part)
    )
    if not files:
        raise ConfigError(f"{label}: the folder {given!r} holds no data files.")
    return [(f, False) for f in files]


def _to_arrow_fs(fs: object) -> pafs.FileSystem:
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def _strip_compression(name: str) -> str:
    for suffix in COMPRESSION_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def _format_of_name(path: str) -> str | None:
    name = _strip_compression(path.rsplit("/", 1)[-1].lower())
    for fmt, extensions in EXTENSIONS.items():
        if name.endswith(extensions):
            return fmt
    return None


def _format_of(files: list[str], given: list[str], label: str, format: str | None) -> str:
    if format is not None:
        if format not in EXTENSIONS:
            raise ConfigError(f"format={format!r} is invalid: use one of {sorted(EXTENSIONS)}.")
        return format
    formats = {fmt for f in files if (fmt := _format_of_name(f)) is not None}
    if len(formats) == 1:
        return formats.pop()
    if len(formats) > 1:
        raise ConfigError(
            f"{label}: {', '.join(given)} mixes file formats ({', '.join(sorted(formats))}).\n"
            "HINT: put each format in its own folder and pass one dataset per format."
        )
    raise ConfigError(
        f"{label}: cannot tell the format of {', '.join(given)} from the file names "
        f"(known extensions: {', '.join(e for v in EXTENSIONS.values() for e in v)}).\n"
        "HINT: use phalanx.data.read_parquet / read_csv / read_json(path) to name the format."
    )


class ParquetSource(Source):
    """Parquet files; each fragment is one row group (``file_index``, ``row_groups``)."""

    def __init__(
        self,
        filesystem: pafs.FileSystem,
        files: list[str],
        file_index: np.ndarray,
        row_groups: np.ndarray,
        fragment_rows: np.ndarray,
        schema: pa.Schema,
        columns: list[str] | None,
        constants: list[dict[str, Any]] | None = None,
    ) -> None:
        self.filesystem = filesystem
        self.files = files
        self.file_index = file_index
        self.row_groups = row_groups
        self.fragment_rows = fragment_rows
        self.schema = schema
        self.columns = columns
        self.constants = constants
        self._local = threading.local()  # one open file per reading thread

    @classmethod
    def scan(
        cls,
        found: FileList,
        label: str,
        columns: Sequence[str] | None,
        constants: list[dict[str, Any]] | None = None,
        constant_schema: pa.Schema | None = None,
    ) -> ParquetSource:
        """Read every file's footer (row groups, schema); refuse mixed schemas."""
        with ThreadPoolExecutor(min(8, len(found.files)), "phalanx-footers") as pool:
            metas = list(pool.map(lambda f: _read_footer(found.filesystem, f), found.files))
        schemas = [
            _project(m.schema.to_arrow_schema(), columns, f, label)
            for f, m in zip(found.files, metas)
        ]
        check_same_schema(found.files, schemas, label)
        counts = [m.num_row_groups for m in metas]
        schema = schemas[0]
        for field in constant_schema or []:
            schema = schema.append(field)
        return cls(
            found.filesystem,
            found.files,
            np.repeat(np.arange(len(metas), dtype=np.int64), counts),
            np.array([i for c in counts for i in range(c)], dtype=np.int64),
            np.array(
                [m.row_group(i).num_rows for m in metas for i in range(m.num_row_groups)],
                dtype=np.int64,
            ),
            schema,
            list(columns) if columns is not None else None,
            constants,
        )

    def read(self, piece: Piece, batch_rows: int) -> Iterator[pa.RecordBatch]:
        file = int(self.file_index[piece.fragment])
        batches = self._open(file).iter_batches(
            batch_size=batch_rows,
            row_groups=[int(self.row_groups[piece.fragment])],
            columns=self.columns,
            use_threads=DECODE_THREADS,
        )
        for batch in slice_stream(batches, piece.start, piece.stop):
            yield with_constants(batch, self.schema, self.constants, file)

    def _open(self, file: int) -> pq.ParquetFile:
        cached = getattr(self._local, "open", None)
        if cached is None or cached[0] != file:
            handle = self.filesystem.open_input_file(self.files[file])
            cached = (file, pq.ParquetFile(handle))
            self._local.open = cached
        return cached[1]

    def subset(self, fragments: Sequence[int]) -> ParquetSource:
        ids = np.asarray(fragments, dtype=np.int64)
        used, file_index = np.unique(self.file_index[ids], return_inverse=True)
        return ParquetSource(
            self.filesystem,
            [self.files[i] for i in used],
            file_index.astype(np.int64),
            self.row_groups[ids],
            self.fragment_rows[ids],
            self.schema,
            self.columns,
            [self.constants[i] for i in used] if self.constants else None,
        )

    def describe(self) -> str:
        return f"{len(self.files)} parquet file(s), {len(self.fragment_rows)} row group(s)"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()


class TextSource(Source):
    """CSV or JSON-lines files; each fragment is one file."""

    def __init__(
        self,
        filesystem: pafs.FileSystem,
        files: list[str],
        fragment_rows: np.ndarray,
        format: str,
        schema: pa.Schema,
        columns: list[str] | None,
    ) -> None:
        self.filesystem = filesystem
        self.files = files
        self.fragment_rows = fragment_rows
        self.format = format
        self.schema = schema
        self.columns = columns

    @classmethod
    def scan(cls, found: FileList, label: str, columns: Sequence[str] | None) -> TextSource:
        scans = [scan_text_file(found.filesystem, f, found.format) for f in found.files]
        schema = unify_text_schemas(found.files, [s for s, _ in scans], label)
        cols = list(columns) if columns is not None else None
        if cols is not None:
            schema = _project(schema, cols, found.where, label)
        rows = np.array([n for _, n in scans], dtype=np.int64)
        return cls(found.filesystem, found.files, rows, found.format, schema, cols)

    def read(self, piece: Piece, batch_rows: int) -> Iterator[pa.RecordBatch]:
        path = self.files[piece.fragment]
        with self.filesystem.open_input_stream(path, compression="detect") as stream:
            reader = open_text_reader(stream, self.format, self.schema, self.columns)
            for batch in slice_stream(iter(reader), piece.start, piece.stop):
                yield from (
                    batch.to_batches(max_chunksize=batch_rows)
                    if isinstance(batch, pa.Table)
                    else _split(batch, batch_rows)
                )

    def subset(self, fragments: Sequence[int]) -> TextSource:
        ids = list(fragments)
        files = [self.files[i] for i in ids]
        rows = self.fragment_rows[ids]
        return TextSource(self.filesystem, files, rows, self.format, self.schema, self.columns)

    def describe(self) -> str:
        return f"{len(self.files)} {self.format} file(s)"


def _split(batch: pa.RecordBatch, rows: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def _read_footer(fs: pafs.FileSystem, path: str) -> pq.FileMetaData:
    with fs.open_input_file(path) as handle:
        return pq.read_metadata(handle)


def _project(schema: pa.Schema, columns: Sequence[str] | None, where: str, label: str) -> pa.Schema:
    if columns is None:
        return schema
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ConfigError(
            f"{label}: columns={list(columns)} asks for {missing}, which {where} does not have; "
            f"its columns are {schema.names}.\nHINT: check the spelling of the column names."
        )
    return pa.schema([schema.field(c) for c in columns])


def check_same_schema(files: list[str], schemas: list[pa.Schema], label: str) -> None:
    """Raise ConfigError naming the first file whose schema differs from the first file's."""
    first = schemas[0]
    for path, schema in zip(files[1:], schemas[1:]):
        if schema.equals(first, check_metadata=False):
            continue
        a, b = dict(zip(first.names, first.types)), dict(zip(schema.names, schema.types))
        detail = [
            f"only in {files[0]}: {sorted(set(a) - set(b))}" if set(a) - set(b) else "",
            f"only in {path}: {sorted(set(b) - set(a))}" if set(b) - set(a) else "",
        ]
        detail += [f"{k}: {a[k]} vs {b[k]}" for k in a if k in b and a[k] != b[k]]
        if not any(detail):
            detail = [f"column order {first.names} vs {schema.names}"]
        raise ConfigError(
            f"{label} has mixed schemas: {path} differs from {files[0]} "
            f"({'; '.join(d for d in detail if d)}).\n"
            "HINT: rewrite the files with one schema, or read only the columns they share, e.g. "
            "phalanx.data.read_parquet(path, columns=[...])."
        )


def with_constants(
    batch: pa.RecordBatch, schema: pa.Schema, constants: list[dict[str, Any]] | None, file: int
) -> pa.RecordBatch:
    """Append a file's partition values (hive ``key=value`` folders) as constant columns."""
    if not constants:
        return batch
    arrays = list(batch.columns)
    for field in schema:
        if field.name not in batch.schema.names:
            value = pa.scalar(constants[file].get(field.name), field.type)
            arrays.append(pa.repeat(value, batch.num_rows))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)

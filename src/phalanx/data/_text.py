"""CSV and JSON-lines files: stream them with pyarrow, infer and unify their schemas."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson

from phalanx.data._describe import shorten
from phalanx.errors import ConfigError

__all__ = ["open_text_reader", "scan_text_file", "unify_text_schemas"]

BLOCK_BYTES = 4 << 20

_scans: dict[tuple[str, str, int, Any], tuple[pa.Schema, int]] = {}
_scans_lock = threading.Lock()


def open_text_reader(
    stream: object, format: str, schema: pa.Schema | None, columns: list[str] | None = None
) -> Any:
    """A streaming reader (iterable of record batches) over one CSV or JSON-lines stream."""
    if format == "csv":
        return pacsv.open_csv(
            stream,
            read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES),
            convert_options=pacsv.ConvertOptions(column_types=schema, include_columns=columns),
        )
    parse = pajson.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="ignore" if schema else "infer"
    )
    return pajson.open_json(
        stream, read_options=pajson.ReadOptions(block_size=BLOCK_BYTES), parse_options=parse
    )


def scan_text_file(fs: pafs.FileSystem, path: str, format: str) -> tuple[pa.Schema, int]:
    """``(schema, rows)`` of one file, read once (bounded memory) and cached by size and mtime."""
    info = fs.get_file_info(path)
    key = (type(fs).__name__, path, info.size or 0, info.mtime_ns)
    with _scans_lock:
        if key in _scans:
            return _scans[key]
    with fs.open_input_stream(path, compression="detect") as stream:
        try:
            reader = open_text_reader(stream, format, None)
            rows = sum(batch.num_rows for batch in reader)
        except pa.ArrowInvalid as exc:
            if "Empty CSV file" in str(exc):
                return pa.schema([]), 0
            # Arrow's parse errors quote the offending row: keep the message short.
            raise ConfigError(
                f"Cannot read {path} as {format}: {shorten(str(exc))}\nHINT: check that the "
                f"file is {format} with one header and the same columns on every line."
            ) from exc
        result = (reader.schema, rows)
    with _scans_lock:
        _scans[key] = result
    return result


def unify_text_schemas(files: list[str], schemas: list[pa.Schema], label: str) -> pa.Schema:
    """One schema for all files: the same columns in the same order; types widened to fit all
    (an integer column in one file and a float column in another reads as float)."""
    first = schemas[0]
    for path, schema in zip(files[1:], schemas[1:]):
        if schema.names != first.names:
            raise ConfigError(
                f"{label} has mixed schemas: {path} has columns {schema.names} but {files[0]} "
                f"has {first.names}.\nHINT: write every file with the same columns, in the same "
                "order, or pass one dataset per kind of file."
            )
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ConfigError(
            f"{label} has mixed schemas: the column types of its files conflict "
            f"({shorten(str(exc))}).\n"
            "HINT: write every file with the same column types."
        ) from exc

"""Request bodies to DataFrames and prediction DataFrames to JSON, with a 4xx for bad input.

A ``POST /predict`` body is one of:

- JSON records: ``{"records": [{"x": 1.0, "y": "a"}, ...]}`` (or the bare list);
- JSON columns: ``{"columns": {"x": [1.0, ...], "y": ["a", ...]}}``;
- Arrow IPC stream bytes (``Content-Type: application/vnd.apache.arrow.stream``);
- Parquet bytes (``Content-Type: application/vnd.apache.parquet``).

The answer is ``{"predictions": [...]}``, one item per input row in input order: the value of the
``predictions`` column, or a dict of the output columns when the model has several.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

__all__ = ["RequestError", "check_columns", "encode_predictions", "parse_body"]

ARROW_TYPES = ("application/vnd.apache.arrow.stream", "application/vnd.apache.arrow.file")
PARQUET_TYPES = ("application/vnd.apache.parquet", "application/x-parquet", "application/parquet")
# curl -d and urllib send a form's type by default: their bodies are read as JSON too.
JSON_TYPES = ("application/json", "application/x-www-form-urlencoded", "text/plain")
JSON_SHAPES = (
    'send {"records": [{"column": value, ...}, ...]} or {"columns": {"column": [value, ...]}}'
)


class RequestError(Exception):
    """Bad input: ``status`` is the HTTP code (4xx), the message says what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_body(body: bytes, content_type: str | None) -> pd.DataFrame:
    """The request's rows as a DataFrame (columns in the order sent)."""
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    if kind in ARROW_TYPES or kind in PARQUET_TYPES:
        return _parse_arrow(body, parquet=kind in PARQUET_TYPES)
    if kind not in JSON_TYPES and not kind.endswith("+json"):
        raise RequestError(
            415,
            f"Content-Type {kind!r} is not supported.\nHINT: send application/json ("
            f"{JSON_SHAPES}), {ARROW_TYPES[0]} or {PARQUET_TYPES[0]}.",
        )
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(
            400, f"The request body is not valid JSON: {exc}.\nHINT: {JSON_SHAPES}."
        ) from None
    return _parse_json(payload)


def _parse_arrow(body: bytes, parquet: bool) -> pd.DataFrame:
    import pyarrow as pa

    try:
        if parquet:
            import pyarrow.parquet as pq

            table = pq.read_table(pa.BufferReader(body))
        else:
            table = pa.ipc.open_stream(pa.BufferReader(body)).read_all()
    except Exception as exc:
        what = "Parquet" if parquet else "an Arrow IPC stream"
        raise RequestError(
            400,
            f"The request body is not {what}: {exc}.\nHINT: write it with "
            + ("pyarrow.parquet.write_table." if parquet else "pyarrow.ipc.new_stream."),
        ) from None
    return table.to_pandas()


def _parse_json(payload: object) -> pd.DataFrame:
    if isinstance(payload, list):
        return _records(payload)
    if isinstance(payload, dict) and set(payload) == {"records"}:
        return _records(payload["records"])
    if isinstance(payload, dict) and set(payload) == {"columns"}:
        return _columns(payload["columns"])
    got = f"an object with keys {sorted(payload)}" if isinstance(payload, dict) else "a value"
    raise RequestError(400, f"The JSON body is {got}.\nHINT: {JSON_SHAPES}.")


def _records(records: object) -> pd.DataFrame:
    if not isinstance(records, list):
        raise RequestError(400, f'"records" must be a list of objects.\nHINT: {JSON_SHAPES}.')
    if not records:
        return pd.DataFrame()
    names = _row_names(records[0], 0)
    for i, row in enumerate(records[1:], start=1):
        got = _row_names(row, i)
        if got != names:
            missing, extra = sorted(set(names) - set(got)), sorted(set(got) - set(names))
            raise RequestError(
                422,
                f"Row {i} has columns {got}, row 0 has {names} (missing: {missing}, extra: "
                f"{extra}).\nHINT: every record must have the same columns.",
            )
    columns = {name: [row[name] for row in records] for name in names}
    return _frame(columns)


def _row_names(row: object, i: int) -> list[str]:
    if not isinstance(row, dict):
        raise RequestError(
            400, f"Row {i} is a {type(row).__name__}, not an object.\nHINT: {JSON_SHAPES}."
        )
    return list(row)


def _columns(columns: object) -> pd.DataFrame:
    if not isinstance(columns, dict) or not all(isinstance(v, list) for v in columns.values()):
        raise RequestError(
            400, f'"columns" must map each column name to a list of values.\nHINT: {JSON_SHAPES}.'
        )
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise RequestError(
            422,
            f"The columns have different lengths: {lengths}.\nHINT: send one value per row "
            "in every column.",
        )
    return _frame(columns)


def _frame(columns: dict[str, list[object]]) -> pd.DataFrame:
    for name, values in columns.items():
        _check_values(name, values)
    return pd.DataFrame({name: _array(values) for name, values in columns.items()})


def _check_values(name: str, values: list[object]) -> None:
    """Each column holds one kind of value: numbers (bool too), strings, or lists of numbers."""
    first = next((_kind(v) for v in values if v is not None), None)
    for row, value in enumerate(values):
        kind = _kind(value)
        if value is not None and (kind not in ("number", "string", "list") or kind != first):
            raise RequestError(
                422,
                f"Column {name!r} row {row} is {value!r} (a {kind}), but its first value is a "
                f"{first}.\nHINT: every value of a column must be a number, or every one a "
                "string, or every one a list of numbers (null stands for a missing value).",
            )


def _kind(value: object) -> str:
    if isinstance(value, bool | int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def _array(values: list[object]) -> list[object]:
    if values and isinstance(values[0], list):  # a tensor column: one array per row
        return [np.asarray(v) for v in values]
    return values


def check_columns(frame: pd.DataFrame, expected: list[str] | None) -> None:
    """A 422 naming the columns the request lacks (when the served model names its inputs)."""
    if expected is None or not len(frame.columns):
        return
    missing = [c for c in expected if c not in frame.columns]
    if missing:
        raise RequestError(
            422,
            f"The request lacks column(s) {missing}; it has {list(map(str, frame.columns))}.\n"
            f"HINT: send every input column the model was trained on: {expected} "
            "(GET /metadata lists them).",
        )


def encode_predictions(out: dict[str, np.ndarray]) -> dict[str, object]:
    """``{"predictions": [...]}``: one JSON value per row (NaN becomes null)."""
    columns = {name: _finite(values.tolist()) for name, values in out.items()}
    if list(columns) == ["predictions"]:
        return {"predictions": columns["predictions"]}
    rows = [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]
    return {"predictions": rows}


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value

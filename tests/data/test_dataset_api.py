"""The Dataset that preprocessors and BatchPredictor return: Ray Data's reading methods."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import phalanx.data


def frame(rows: int = 50) -> pd.DataFrame:
    return pd.DataFrame({"id": np.arange(rows), "x": np.arange(rows) * 0.5})


def test_take_show_count_schema_like_ray_data(capsys):
    ds = phalanx.data.from_pandas(frame())
    assert ds.count() == 50
    assert ds.schema().names == ["id", "x"] and ds.columns() == ["id", "x"]
    assert ds.take(2) == [{"id": 0, "x": 0.0}, {"id": 1, "x": 0.5}]
    assert len(ds.take()) == 20  # Ray's default limit
    ds.show(3)
    assert capsys.readouterr().out.splitlines() == [
        "{'id': 0, 'x': 0.0}",
        "{'id': 1, 'x': 0.5}",
        "{'id': 2, 'x': 1.0}",
    ]
    assert phalanx.data.from_pandas(frame(0)).take(5) == []


def test_take_all_and_to_pandas_refuse_more_rows_than_the_limit():
    ds = phalanx.data.from_pandas(frame())
    assert len(ds.take_all()) == 50 and len(ds.to_pandas(limit=50)) == 50
    with pytest.raises(ValueError, match=r"(?s)50 rows, more than the given limit of 10.*HINT"):
        ds.take_all(limit=10)
    with pytest.raises(ValueError, match="limit of 49"):
        ds.to_pandas(limit=49)


def test_iter_batches_and_take_batch_formats():
    ds = phalanx.data.from_pandas(frame())
    batches = list(ds.iter_batches(batch_size=20))
    assert [len(b["id"]) for b in batches] == [20, 20, 10]  # default format: numpy
    assert isinstance(ds.take_batch(5, batch_format="pandas"), pd.DataFrame)
    assert isinstance(ds.take_batch(5, batch_format="pyarrow"), pa.Table)
    assert ds.take_batch(5)["x"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_map_batches_with_a_function_a_callable_class_and_a_generator():
    ds = phalanx.data.from_pandas(frame())
    doubled = ds.map_batches(lambda b: {"id": b["id"], "y": b["x"] * 2}, batch_size=16)
    assert doubled.count() == 50 and doubled.take(2)[1] == {"id": 1, "y": 1.0}

    class AddOffset:
        def __init__(self, offset):
            self.offset = offset

        def __call__(self, df, scale):
            return df.assign(x=df["x"] * scale + self.offset)

    shifted = ds.map_batches(
        AddOffset, batch_format="pandas", fn_constructor_args=(100,), fn_kwargs={"scale": 2}
    )
    assert shifted.take(1)[0]["x"] == 100.0

    def evens(batch):
        keep = batch["id"] % 2 == 0
        yield {"id": batch["id"][keep]}

    assert ds.map_batches(evens).count() == 25  # a function may change the row count
    assert ds.map_batches(lambda b: {"id": b["id"][:0]}).count() == 0
    with pytest.raises(ValueError, match="fn_constructor_args"):
        ds.map_batches(lambda b: b, fn_constructor_args=(1,))


def test_aggregates_and_select_columns():
    ds = phalanx.data.from_pandas(frame(4))
    assert ds.sum(on="id") == 6 and ds.max(on="x") == 1.5 and ds.mean(on="id") == 1.5
    assert ds.select_columns(["x"]).columns() == ["x"]
    with pytest.raises(ValueError, match="no such column"):
        ds.sum(on="nope")


def test_transform_returns_a_dataset_with_the_same_methods():
    from phalanx.preprocess import StandardScaler

    out = StandardScaler(columns=["x"]).fit_transform(frame())
    assert out.count() == 50
    assert abs(out.mean(on="x")) < 1e-9
    assert [row["id"] for row in out.take(3)] == [0, 1, 2]


def test_a_bad_csv_row_is_not_printed_whole(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,b,c\n1,2,3\n" + "y" * 5000 + ",5\n")
    with pytest.raises(ValueError) as info:
        phalanx.data.read_csv(str(path))
    message = str(info.value)
    assert "rows.csv" in message and "HINT" in message
    assert len(message) < 700 and "y" * 400 not in message


def test_data_never_imports_the_torch_package():
    # phalanx.data sits below phalanx.torch (which brings the trainer stack): even device="auto"
    # finds the worker's device through the shared rule in _internal, not through phalanx.torch.
    code = (
        "import sys, phalanx.data\n"
        "print('torch' in sys.modules, 'phalanx.torch' in sys.modules)\n"
        "ds = phalanx.data.from_items([{'x': 1.0}, {'x': 2.0}])\n"
        "batch = next(iter(ds.iter_torch_batches(batch_size=2, device='auto')))\n"
        "print(batch['x'].device.type, 'phalanx.torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["False False", "cpu False"]

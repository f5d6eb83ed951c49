"""Every accepted kind of data, and the errors for what cannot be read."""

from __future__ import annotations

import json
import os

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

from phalanx import ConfigError, DataConfig
from phalanx.data import (
    as_dataset,
    from_numpy,
    read_csv,
    read_json,
    read_parquet,
)
from phalanx.data._ingest import require_columns, shard_datasets, validate_datasets

ROWS = 50


def frame(start: int = 0, rows: int = ROWS) -> pd.DataFrame:
    ids = np.arange(start, start + rows)
    return pd.DataFrame({"id": ids, "x": ids * 0.5})


def all_ids(value, world: int = 2) -> list[int]:
    validate_datasets({"d": value}, DataConfig())
    shards = shard_datasets({"d": value}, DataConfig(), world)
    return sorted(i for s in shards for b in s["d"].iter_batches(batch_size=7) for i in b["id"])


@pytest.fixture
def parquet_folder(tmp_path):
    folder = tmp_path / "pq"
    (folder / "sub").mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(frame(0, 30)), folder / "a.parquet", row_group_size=8)
    pq.write_table(pa.Table.from_pandas(frame(30, 20)), folder / "sub" / "b.parquet")
    (folder / "_SUCCESS").write_text("")
    (folder / ".hidden.parquet").write_text("not parquet")
    (folder / "README.md").write_text("not data")
    return folder


def write_text_files(folder, fmt: str) -> None:
    folder.mkdir()
    for part, start in (("a", 0), ("b", 30)):
        df = frame(start, 30 if part == "a" else 20)
        if fmt == "csv":
            df.to_csv(folder / f"{part}.csv", index=False)
        else:
            df.to_json(folder / f"{part}.jsonl", orient="records", lines=True)


@pytest.mark.parametrize(
    "make",
    [
        lambda: frame(),
        lambda: pa.Table.from_pandas(frame()),
        lambda: {"id": np.arange(ROWS), "x": np.zeros(ROWS)},
        lambda: frame().to_dict("records"),
        lambda: lambda: frame(),  # a factory
    ],
    ids=["pandas", "arrow", "numpy", "records", "callable"],
)
def test_in_memory_kinds(make):
    assert all_ids(make(), world=3) == list(range(ROWS - ROWS % 3))


def test_parquet_folder_skips_hidden_and_other_files(parquet_folder):
    assert all_ids(str(parquet_folder)) == list(range(ROWS))
    assert all_ids([str(parquet_folder / "a.parquet")]) == list(range(30))


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_text_folders(tmp_path, fmt):
    write_text_files(tmp_path / fmt, fmt)
    assert all_ids(str(tmp_path / fmt)) == list(range(ROWS))
    reader = read_csv if fmt == "csv" else read_json
    dataset = reader(str(tmp_path / fmt), columns=["x"])
    assert dataset.columns() == ["x"] and dataset.count() == ROWS


def test_compressed_csv(tmp_path):
    frame().to_csv(tmp_path / "d.csv.gz", index=False, compression="gzip")
    assert all_ids(str(tmp_path / "d.csv.gz")) == list(range(ROWS))


def test_memory_filesystem_uri():
    fs = fsspec.filesystem("memory")
    with fs.open("/phalanx-test/d/part.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pandas(frame()), f, row_group_size=10)
    try:
        assert all_ids("memory://phalanx-test/d") == list(range(ROWS))
    finally:
        fs.rm("/phalanx-test", recursive=True)


def test_pyarrow_dataset_keeps_hive_partition_columns(tmp_path):
    for part in (0, 1):
        (tmp_path / f"part={part}").mkdir()
        pq.write_table(
            pa.Table.from_pandas(frame(part * 25, 25)), tmp_path / f"part={part}" / "f.parquet"
        )
    dataset = pds.dataset(str(tmp_path), format="parquet", partitioning="hive")
    assert all_ids(dataset) == list(range(ROWS))
    table = as_dataset(dataset).iterator().to_arrow()
    assert table.column("part").to_pylist() == [0] * 25 + [1] * 25


def test_numpy_tensor_columns_keep_their_shape():
    images = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)
    batch = next(from_numpy({"image": images, "label": np.arange(4)}).iter_batches(batch_size=3))
    assert batch["image"].shape == (3, 2, 3) and np.array_equal(batch["image"], images[:3])


# -- errors -------------------------------------------------------------------------------------


def test_missing_path_is_named(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"(?s)datasets\['train'\].*does not exist.*HINT"):
        validate_datasets({"train": missing}, DataConfig())


def test_mixed_parquet_schemas_are_refused(tmp_path):
    pq.write_table(pa.table({"a": [1], "b": [1.0]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"a": [1], "c": [1.0]}), tmp_path / "2.parquet")
    with pytest.raises(ConfigError, match=r"(?s)mixed schemas.*only in .*2.parquet: \['c'\].*HINT"):
        validate_datasets({"train": str(tmp_path)}, DataConfig())
    assert read_parquet(str(tmp_path), columns=["a"]).count() == 2  # shared columns read fine


def test_mixed_csv_columns_are_refused(tmp_path):
    (tmp_path / "1.csv").write_text("a,b\n1,2\n")
    (tmp_path / "2.csv").write_text("a,c\n1,2\n")
    with pytest.raises(ConfigError, match="mixed schemas"):
        validate_datasets({"train": str(tmp_path)}, DataConfig())


def test_csv_types_are_widened_across_files(tmp_path):
    (tmp_path / "1.csv").write_text("a\n1\n")
    (tmp_path / "2.csv").write_text("a\n1.5\n")
    assert as_dataset(str(tmp_path)).iterator().to_pandas()["a"].tolist() == [1.0, 1.5]


def test_mixed_formats_and_unknown_extensions(tmp_path):
    pq.write_table(pa.table({"a": [1]}), tmp_path / "1.parquet")
    (tmp_path / "2.jsonl").write_text(json.dumps({"a": 1}) + "\n")
    with pytest.raises(ConfigError, match="mixes file formats"):
        validate_datasets({"train": str(tmp_path)}, DataConfig())
    (tmp_path / "x.bin").write_text("?")
    with pytest.raises(ConfigError, match=r"(?s)cannot tell the format.*read_parquet"):
        validate_datasets({"train": str(tmp_path / "x.bin")}, DataConfig())


def test_mixed_records_are_refused():
    with pytest.raises(ConfigError, match=r"mixed schemas: record 0 .* record 1"):
        validate_datasets({"train": [{"a": 1}, {"b": 2}]}, DataConfig())


def test_unsupported_kind_lists_what_is_accepted():
    with pytest.raises(ConfigError, match=r"(?s)datasets\['train'\] is a builtins.int.*pandas"):
        validate_datasets({"train": 3}, DataConfig())


def test_uneven_arrays_and_unknown_split_names():
    with pytest.raises(ConfigError, match="different lengths"):
        validate_datasets({"train": {"a": np.zeros(2), "b": np.zeros(3)}}, DataConfig())
    with pytest.raises(ConfigError, match=r"(?s)names \['tain'\].*given: \['train'\]"):
        validate_datasets({"train": frame()}, DataConfig(datasets_to_split=["tain"]))


def test_require_columns_names_the_missing_label(parquet_folder):
    require_columns(frame(), ["id"], "label_column='id'")
    for value in (frame(), str(parquet_folder), as_dataset(frame()).iterator()):
        with pytest.raises(
            ConfigError, match=r"(?s)label_column='y' needs column\(s\) \['y'\].*'x'"
        ):
            require_columns(value, ["y"], "label_column='y'", name="train")
    require_columns(lambda: frame(), ["y"], "label_column='y'")  # factories: checked later


def test_factory_errors_name_the_dataset():
    def broken():
        raise RuntimeError("no data today")

    validate_datasets({"train": broken}, DataConfig())  # not called at construction
    with pytest.raises(RuntimeError, match="no data today") as info:
        shard_datasets({"train": broken}, DataConfig(), 2)
    assert "datasets['train']" in "".join(info.value.__notes__)


def test_relative_paths_resolve_against_the_driver_cwd(parquet_folder, monkeypatch):
    monkeypatch.chdir(parquet_folder.parent)
    assert all_ids(os.path.join("pq", "a.parquet")) == list(range(30))


def test_the_trainer_checks_datasets_at_construction(tmp_path):
    from phalanx import DataParallelTrainer

    with pytest.raises(ConfigError, match="does not exist"):
        DataParallelTrainer(lambda: None, datasets={"train": str(tmp_path / "missing")})


class FakeRayDataset:
    """Stands in for ray.data.Dataset: only its module name and the ray_data hooks matter."""

    __module__ = "ray.data.dataset"

    def schema(self):
        return pa.schema([("a", pa.int64())])


def test_ray_datasets_are_handed_to_the_ray_data_module(monkeypatch):
    import sys

    from phalanx.data import _ray_data as ray_data

    monkeypatch.setitem(sys.modules, "ray", sys.modules.get("ray") or object())
    monkeypatch.setattr(ray_data, "is_ray_dataset", lambda obj: isinstance(obj, FakeRayDataset))
    monkeypatch.setattr(
        ray_data, "split_ray_dataset", lambda ds, n: [f"split{r}" for r in range(n)]
    )
    monkeypatch.setattr(ray_data, "ray_dataset_iterator", lambda ds: "whole")
    monkeypatch.setattr(ray_data, "with_execution_options", lambda ds, options: ds)
    datasets = {"train": FakeRayDataset(), "valid": FakeRayDataset()}
    validate_datasets(datasets, DataConfig())
    shards = shard_datasets(datasets, DataConfig(datasets_to_split=["train"]), 2)
    assert shards == [{"train": "split0", "valid": "whole"}, {"train": "split1", "valid": "whole"}]
    with pytest.raises(ConfigError, match=r"needs column\(s\) \['b'\]"):
        require_columns(FakeRayDataset(), ["b"], "label_column='b'")

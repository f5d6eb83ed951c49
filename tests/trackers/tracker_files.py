"""Read back what each tracker wrote, with the tracker's own reader where it has one."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import time
from typing import Any


def import_tensorboard_reader() -> None:
    """Import TensorBoard's reader now, in full: it imports TensorFlow lazily when TensorFlow is
    installed, and TensorFlow sets environment variables (no_leaks would blame the test)."""
    import pytest

    pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from tensorboard.compat import tf

    getattr(tf, "__version__", None)


def tensorboard_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series, in file order, read by TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(logdir, size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def csv_rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def json_rows(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def wandb_offline_runs(root: str) -> list[str]:
    return sorted(glob.glob(os.path.join(root, "wandb", "offline-run-*")))


def wandb_records(run_dir: str) -> list[Any]:
    """The records of an offline run's ``run-<id>.wandb`` file, decoded with wandb's own protobuf
    schema. The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic, version), then
    32 KiB blocks of records (crc32, length, type; FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:8]
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_finished_records(run_dir: str, timeout_s: float = 30.0) -> list[Any]:
    """The records once the run's exit record is written: wandb-core writes the file a moment
    after ``run.finish()`` returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(run_dir)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{run_dir} has no exit record after {timeout_s}s")
        time.sleep(0.05)


def wandb_history(run_dir: str) -> list[dict[str, Any]]:
    rows = []
    for record in wandb_finished_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows.append(row)
    return rows


def wandb_config(run_dir: str) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for record in wandb_finished_records(run_dir):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update
        if kind in ("run", "config"):
            config.update({u.key: json.loads(u.value_json) for u in updates})
    return config

"""A checkpoint's commit record: the file that says a checkpoint directory is complete.

Every commit writes ``.phalanx_commits/<dir_name>.json`` in the run directory once the
checkpoint's files are durable and visible (after the rename on a local store, as the last
object on an object store)::

    {"dir_name": "checkpoint_000002", "round": 2, "attempt": 1, "committed": 1765077000.0,
     "metrics": {...}, "checkpoint_class": "phalanx.torch.TorchCheckpoint"}

The record lives beside the checkpoint, not in it: a checkpoint directory holds the user's files
alone, as in Ray Train (a listing, an MLflow artifact upload, a push to a model hub see nothing
of phalanx's). It is removed before the checkpoint is deleted, so a record never outlives its
directory's files (a later round that reuses the name cannot inherit it).

The run's index (the snapshot and its journal) stays the source of truth. The record is what
lets a run whose index lost an entry (a crash between the commit and the index write) or lost
the index altogether (a copy or a sync that skipped it, a file taken for a cache) find its
checkpoints again instead of discarding them: a directory with a record that names it is a
committed checkpoint, and is re-indexed from the record (``CheckpointManager.recover_unindexed``).
A record whose file was copied or renamed to another name names another directory: it proves
nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from phalanx._internal.storage.history import encode_json
from phalanx._internal.storage.store import RunStore
from phalanx.errors import StorageError

COMMIT_RECORDS_DIR = ".phalanx_commits"


def record_file(dir_name: str) -> str:
    """Where the commit record of the checkpoint ``dir_name`` is, relative to the run."""
    return f"{COMMIT_RECORDS_DIR}/{dir_name}.json"


@dataclass(frozen=True)
class CommitRecord:
    """What a committed checkpoint says about itself."""

    dir_name: str
    round: int
    attempt: int
    metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint_class: str | None = None
    committed: float = field(default_factory=time.time)

    def encode(self) -> bytes:
        return encode_json(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> CommitRecord | None:
        """The record in ``data``; None when it is not one phalanx wrote (cut, edited)."""
        try:
            raw = json.loads(data)
            record = cls(
                dir_name=str(raw["dir_name"]),
                round=int(raw["round"]),
                attempt=int(raw["attempt"]),
                metrics=dict(raw.get("metrics") or {}),
                checkpoint_class=raw.get("checkpoint_class"),
                committed=float(raw.get("committed", 0.0)),
            )
        except (ValueError, KeyError, TypeError):
            return None
        return record if record.round >= 0 else None


def read_commit_record(storage: RunStore, dir_name: str) -> CommitRecord | None:
    """The commit record of the directory ``dir_name`` of the run, if it has one that names it
    (a record file copied or renamed from another checkpoint's names that one)."""
    try:
        data = storage.read(record_file(dir_name))
    except StorageError:
        return None
    record = CommitRecord.decode(data) if data is not None else None
    return record if record is not None and record.dir_name == dir_name else None


def write_commit_record(storage: RunStore, record: CommitRecord) -> None:
    """The record, written whole (a failure leaves none, never half of one)."""
    if storage.local_path is not None:  # object stores have no directories (and a check costs)
        storage.filesystem.makedirs(storage.path(COMMIT_RECORDS_DIR), exist_ok=True)
    storage.write_atomic(record_file(record.dir_name), record.encode())


def remove_commit_record(storage: RunStore, dir_name: str) -> None:
    """Before the checkpoint's files go: a record never outlives its directory."""
    storage.remove(record_file(dir_name))


def has_commit_records(storage: RunStore) -> bool:
    """Whether some directory of the run is a committed checkpoint, by its own record (what a
    run whose index is gone still has)."""
    fs = storage.filesystem
    try:
        listing = fs.ls(storage.path(COMMIT_RECORDS_DIR), detail=False)
        dirs = {
            e["name"].rstrip("/").rsplit("/", 1)[-1]
            for e in fs.ls(storage.run_path, detail=True)
            if e.get("type") == "directory"
        }
    except (OSError, ValueError):
        return False
    names = (str(p).rstrip("/").rsplit("/", 1)[-1].removesuffix(".json") for p in listing)
    return any(n in dirs and read_commit_record(storage, n) is not None for n in names)

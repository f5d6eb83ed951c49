"""A checkpoint's own commit record: the file that says a checkpoint directory is complete.

Every commit writes ``.phalanx_commit.json`` into the checkpoint as its last step before the
checkpoint is visible (inside the staged directory before the rename on a local store; the last
object on an object store)::

    {"dir_name": "checkpoint_000002", "round": 2, "attempt": 1, "committed": 1765077000.0,
     "metrics": {...}, "checkpoint_class": "phalanx.torch.TorchCheckpoint"}

The run's index (the snapshot and its journal) stays the source of truth. The record is what
lets a run whose index lost an entry (a crash between the commit and the index write) or lost
the index altogether (a copy or a backup that skipped it, a file taken for a cache) find its
checkpoints again instead of discarding them: a directory with a record that names it is a
committed checkpoint, and is re-indexed from the record (``CheckpointManager.recover_unindexed``).
A record naming another directory was copied in with files from elsewhere: it proves nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from phalanx._internal.storage.history import encode_json
from phalanx._internal.storage.store import RunStore
from phalanx.errors import StorageError

COMMIT_RECORD_FILE = ".phalanx_commit.json"


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
    (a record copied in from another checkpoint names that one, and is not this commit's)."""
    try:
        data = storage.read(f"{dir_name}/{COMMIT_RECORD_FILE}")
    except StorageError:
        return None
    record = CommitRecord.decode(data) if data is not None else None
    return record if record is not None and record.dir_name == dir_name else None


def has_commit_records(storage: RunStore) -> bool:
    """Whether some directory of the run is a committed checkpoint, by its own record (what a
    run whose index is gone still has)."""
    fs = storage.filesystem
    try:
        listing = fs.ls(storage.run_path, detail=True)
    except (OSError, ValueError):
        return False
    names = (
        e["name"].rstrip("/").rsplit("/", 1)[-1] for e in listing if e.get("type") == "directory"
    )
    return any(read_commit_record(storage, name) is not None for name in names)

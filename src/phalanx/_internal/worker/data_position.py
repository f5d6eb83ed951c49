"""Where each of this rank's data streams is: sent with every ``report()``, stored with every
checkpoint, handed back when a function starts from that checkpoint.

A *stream* is anything that reads data in an order the run must continue after a restart: a
phalanx dataset shard (``get_dataset_shard``), a DataLoader from ``prepare_data_loader``. Each
has a key (``"dataset/<name>"``, ``"loader/<n>"``) and a ``position_state()`` that returns a small
JSON-able dict (a few integers: no I/O, nothing proportional to the data) or None before its
first batch.

The driver stores, per committed checkpoint, one *record* per key (``CHECKPOINT_FILE`` in the
checkpoint directory). Dataset records are combined on the driver from every rank's state (the
driver built the shards, so it knows which rows each rank was given); other streams are stored as
``{"world_size": W, "ranks": [state of rank 0, ...]}`` and re-split by the stream itself on the
worker (``resume_record``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpoint

__all__ = [
    "CHECKPOINT_FILE",
    "DataPositions",
    "DatasetRecord",
    "RanksRecord",
    "Record",
    "Snapshot",
    "StreamState",
    "Tracked",
    "build_record",
    "dataset_key",
    "dataset_records",
    "encode_record",
    "loader_key",
    "read_record",
]

logger = logging.getLogger(__name__)

DATASET_PREFIX = "dataset/"

CHECKPOINT_FILE = ".phalanx_data_position.json"
"""The records of every stream at the checkpoint's round, in the checkpoint directory."""


StreamState = dict[str, object]
"""One stream's ``position_state()``: a small JSON-able dict (a few integers)."""

Snapshot = dict[str, StreamState]
"""A rank's streams after a round, by key: what ``report()`` sends (``DataPositions.snapshot``)."""

Record = dict[str, object]
"""The record of every stream at a checkpoint's round, by key (a dataset's as its package
combined it, any other stream's a :class:`RanksRecord`): what ``CHECKPOINT_FILE`` holds."""


DatasetRecord = dict[str, Any]
"""A dataset's record as the data package combines and reads it (``phalanx.data._position``):
read back from JSON, its fields are checked where they are used."""


class RanksRecord(TypedDict):
    """The record of a stream the driver does not combine: every rank's state, re-split by the
    stream itself on the worker."""

    world_size: int
    ranks: list[StreamState | None]


class Tracked(Protocol):
    def position_state(self) -> StreamState | None: ...


def dataset_key(name: str) -> str:
    return f"{DATASET_PREFIX}{name}"


def loader_key(index: int) -> str:
    return f"loader/{index}"


class DataPositions:
    """One rank's streams (a Session has one)."""

    def __init__(self, resume: Record | None = None) -> None:
        self._streams: dict[str, Tracked] = {}
        self._resume = resume or {}
        self._loaders = 0

    def track(self, key: str, stream: Tracked) -> None:
        self._streams[key] = stream

    def next_loader_key(self) -> str:
        """A key for the next DataLoader this rank prepares (they are numbered in call order,
        the same on every rank and in every attempt)."""
        key = loader_key(self._loaders)
        self._loaders += 1
        return key

    def snapshot(self) -> Snapshot | None:
        """Every stream's state now (None when no stream has one): what ``report()`` sends."""
        if not self._streams:
            return None
        states: Snapshot = {}
        for key, stream in self._streams.items():
            state = stream.position_state()
            if state is not None:
                states[key] = state
        return states or None

    def resume_record(self, key: str) -> StreamState | None:
        """The record stored for ``key`` with the checkpoint this function started from (None:
        a fresh start, or the stream was not there)."""
        record = self._resume.get(key)
        return record if isinstance(record, dict) else None


# -- the driver's side: one record per stream, stored with each checkpoint -----------------------

RankStates = Sequence[Snapshot | None]
"""Each rank's last ``snapshot()`` (None: the rank reported no position yet)."""


def build_record(
    snapshots: RankStates, combine_dataset: Callable[[str, list[StreamState | None]], StreamState]
) -> Record:
    """The record of every stream any rank reported: a dataset's from
    ``combine_dataset(name, [state of rank 0, ...])`` (the driver knows its shards), any
    other stream's as ``{"world_size": W, "ranks": [...]}``. Empty when no rank has a stream."""
    keys = sorted({key for snapshot in snapshots if snapshot for key in snapshot})
    record: Record = {}
    for key in keys:
        states = [snapshot.get(key) if snapshot else None for snapshot in snapshots]
        if key.startswith(DATASET_PREFIX):
            record[key] = combine_dataset(key[len(DATASET_PREFIX) :], states)
        else:
            record[key] = RanksRecord(world_size=len(snapshots), ranks=states)
    return record


def encode_record(record: Mapping[str, object]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def dataset_records(record: Mapping[str, object] | None) -> dict[str, DatasetRecord]:
    """The records of the datasets in ``record``, by dataset name."""
    return {
        key[len(DATASET_PREFIX) :]: value
        for key, value in (record or {}).items()
        if key.startswith(DATASET_PREFIX) and isinstance(value, dict)
    }


def read_record(checkpoint: Checkpoint | None) -> Record | None:
    """The records stored with ``checkpoint``; None when it has none
    (taken before any stream was read, by another tool, or by a phalanx without positions):
    the data then starts afresh, as in Ray."""
    if checkpoint is None:
        return None
    path = f"{checkpoint.path.rstrip('/')}/{CHECKPOINT_FILE}"
    try:
        with checkpoint.filesystem.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        logger.warning(
            "The data position stored with the checkpoint (%s) is not valid JSON: the data "
            "starts the epoch afresh. HINT: the file was changed or truncated after the "
            "checkpoint was committed; delete it to silence this warning.",
            path,
        )
        return None
    return record if isinstance(record, dict) else None

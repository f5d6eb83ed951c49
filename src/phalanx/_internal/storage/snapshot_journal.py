"""The snapshot's journal: what each commit changed, appended, so a commit costs O(1).

The snapshot (``checkpoint_manager_snapshot.json``) lists every kept checkpoint. Rewriting it at
every commit made a run that keeps k checkpoints (``num_to_keep=None``, Ray's default) cost
O(k) per commit, O(k^2) in all. On a store that appends (the local store) a commit now appends one line to
``.phalanx_snapshot_journal.jsonl`` (fsynced, like the snapshot it replaces)::

    {"seq": 7, "latest": "checkpoint_000006", "next_round": 7,
     "put": [{"dir_name": ..., "metrics": ..., "round": ...}], "remove": [...], "statuses": {...}}

and the snapshot is compacted (rewritten whole, temp file + rename, with ``"journal_seq"``: the
last record it holds) once the journal has as many records as the snapshot has checkpoints
(O(1) per commit amortised), when an attempt begins or ends, and at the end of ``fit()``. The
journal is then removed; records it still holds after a crash between the two have a ``seq``
the snapshot already has, and are skipped.

Readers go through :func:`read_state`, which applies the journal to the snapshot. A run written
before the journal existed has none: its snapshot is read as it always was. A phalanx without
the journal reading a run cut off mid-``fit()`` sees the snapshot of its last compaction.
Stores without appends (object stores): there the snapshot is still rewritten at every commit.
"""

from __future__ import annotations

import json
from typing import Any

from phalanx._internal.storage.run_storage import SNAPSHOT_FILE
from phalanx._internal.storage.store import RunStore
from phalanx.errors import StorageError

JOURNAL_FILE = ".phalanx_snapshot_journal.jsonl"
COMPACT_MIN_RECORDS = 64  # below this many checkpoints, compact every 64 records
_READ_ATTEMPTS = 5


def read_state(storage: RunStore) -> dict[str, Any] | None:
    """The snapshot's state with the journal applied; None without a snapshot.

    Raises ValueError (KeyError, TypeError) when the snapshot is not what phalanx writes.
    A compaction between reading the snapshot and the journal shows as a gap in ``seq``:
    read both again.
    """
    for _ in range(_READ_ATTEMPTS):
        raw = storage.read(SNAPSHOT_FILE)
        if raw is None:
            return None
        state = json.loads(raw)
        if not isinstance(state, dict):
            raise ValueError("the snapshot is not a JSON object")
        if not storage.appends:
            return state
        if apply_records(state, read_records(storage)):
            return state
    raise StorageError(
        f"The snapshot {storage.path(SNAPSHOT_FILE)!r} and its journal changed under every one "
        f"of {_READ_ATTEMPTS} reads.\nHINT: read the run again."
    )


def read_records(storage: RunStore) -> list[dict[str, Any]]:
    """The journal's records in order; a last line cut by a crash (or being written) ends it."""
    data = storage.read(JOURNAL_FILE) or b""
    records = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:  # cut mid-write: that commit never happened
            break
        if not isinstance(record, dict) or not isinstance(record.get("seq"), int):
            break
        records.append(record)
    return records


def apply_records(state: dict[str, Any], records: list[dict[str, Any]]) -> bool:
    """Apply the journal's records after the snapshot's ``journal_seq`` to ``state`` in place.
    False when a record is missing (the journal was compacted meanwhile)."""
    seq = int(state.get("journal_seq", 0))
    entries = {c["dir_name"]: c for c in state["checkpoints"]}  # ordered: commit order
    statuses = dict(state.get("statuses", {}))
    for record in records:
        if record["seq"] <= seq:
            continue  # in the snapshot already (a crash before the journal was removed)
        if record["seq"] != seq + 1:
            return False
        seq = record["seq"]
        for entry in record.get("put", []):
            entries[entry["dir_name"]] = entry  # a validation's metrics replace it in place
        for name in record.get("remove", []):
            entries.pop(name, None)
            statuses.pop(name, None)
        statuses.update(record.get("statuses", {}))
        state["latest"] = record.get("latest")
        state["next_round"] = record["next_round"]
    state.update(checkpoints=list(entries.values()), statuses=statuses, journal_seq=seq)
    return True


def append_record(storage: RunStore, line: str) -> None:
    """Append one record durably (fsync), whole or not at all: on an error the file is cut back
    to where it was, so the next record never follows half a line."""
    storage.append_durable(JOURNAL_FILE, (line + "\n").encode())


def remove_journal(storage: RunStore) -> None:
    """After a compaction: the snapshot holds every record now."""
    storage.remove(JOURNAL_FILE)

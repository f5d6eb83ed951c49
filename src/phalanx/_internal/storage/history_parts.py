"""The metrics history on object stores: one object per flush, compacted now and then.

Object stores cannot append, so rewriting ``metrics.jsonl`` whole at every flush (every second
and at every commit) cost O(rows so far) per flush. Each flush now PUTs its rows as
``.phalanx_history/<file>.<seq>`` (9 digits); readers take the base file, then the parts after
the one the base already holds, in order. A compaction rewrites the base with every part,
records ``"<seq> <bytes>"`` in ``.phalanx_history/<file>.compacted`` (the last part in the base,
and the base's length), then deletes those parts. It runs when a run (re)starts, when the parts
hold as many bytes as the base (so O(1) per row amortised) or number ``MAX_PARTS``, and at the
end of ``fit()``, which leaves the file whole, as before.

A reader checks that the marker did not change while it read and that the base has the length
the marker names; otherwise a compaction ran meanwhile and it reads again. A run written before
parts existed has no marker and no parts: its file is read as it always was. Local files are
appended to and never use this.

:class:`PartsLog` is the object store's ``RunLog``: it keeps what it wrote, so a flush or a
compaction never reads the file back (the run lock makes its owner the only writer).
"""

from __future__ import annotations

from typing import Any

from phalanx._foundation.fs.access import storage_errors
from phalanx._internal.storage.store import RunStore
from phalanx.errors import StorageError

PARTS_DIR = ".phalanx_history"
MAX_PARTS = 1000
_READ_ATTEMPTS = 5


def part_path(name: str, seq: int) -> str:
    return f"{PARTS_DIR}/{name}.{seq:09d}"


def _marker_path(name: str) -> str:
    return f"{PARTS_DIR}/{name}.compacted"


def read_marker(storage: RunStore, name: str) -> tuple[int, int] | None:
    """(last part in the base, the base's length), None for a run without parts."""
    raw = storage.read(_marker_path(name))
    if raw is None:
        return None
    try:
        seq, length = raw.split()
        return int(seq), int(length)
    except ValueError as exc:
        raise StorageError(
            f"{storage.path(_marker_path(name))!r} is damaged ({raw[:40]!r}).\nHINT: the file "
            "was edited; remove it only if no .phalanx_history part is in the base file already."
        ) from exc


def list_parts(storage: RunStore, name: str) -> list[int]:
    """The numbers of ``name``'s parts, in order."""
    fs, directory = storage.filesystem, storage.path(PARTS_DIR)
    with storage_errors("list", storage.run_uri + "/" + PARTS_DIR):
        fs.invalidate_cache(directory)  # s3fs caches listings: this process wrote parts since
        paths: list[Any] = fs.ls(directory, detail=False) if fs.exists(directory) else []
    seqs = []
    for path in paths:
        stem, _, suffix = str(path).rstrip("/").rsplit("/", 1)[-1].rpartition(".")
        if stem == name and suffix.isdigit():
            seqs.append(int(suffix))
    return sorted(seqs)


def read_whole(storage: RunStore, name: str) -> tuple[bytes, int, int]:
    """``name``'s rows as one file: the base, then the parts it does not hold. Returns the
    bytes, the last part's number and the base's length."""
    for _ in range(_READ_ATTEMPTS):
        before = read_marker(storage, name)
        base = storage.read(name) or b""
        done = before[0] if before else 0
        seqs = [s for s in list_parts(storage, name) if s > done]
        parts = [storage.read(part_path(name, s)) for s in seqs]
        if read_marker(storage, name) != before or (before and before[1] != len(base)):
            continue  # a compaction ran meanwhile
        if any(p is None for p in parts):
            continue  # deleted by a compaction that finished meanwhile
        return base + b"".join(p or b"" for p in parts), max([done, *seqs]), len(base)
    raise StorageError(
        f"{storage.path(name)!r} and its parts changed under every one of {_READ_ATTEMPTS} reads."
        "\nHINT: read the run again."
    )


def write_part(storage: RunStore, name: str, seq: int, data: bytes) -> None:
    storage.write_atomic(part_path(name, seq), data)  # one PUT: there whole, or not at all


def compact(storage: RunStore, name: str, data: bytes, seq: int) -> None:
    """Make ``data`` (the base with parts up to ``seq``) the base; then drop those parts."""
    if data or storage.read(name) is not None:
        storage.write_atomic(name, data)
    storage.write_atomic(_marker_path(name), f"{seq} {len(data)}".encode())
    folded = [storage.path(part_path(name, s)) for s in list_parts(storage, name) if s <= seq]
    if folded:
        with storage_errors("remove", storage.run_uri + "/" + PARTS_DIR):
            storage.filesystem.rm(folded)  # one batch request on S3


class PartsLog:
    """One history file of a run on an object store (see ``store.RunLog``)."""

    def __init__(self, storage: RunStore, name: str) -> None:
        self.storage = storage
        self.name = name
        self._seq = 0  # the last part written
        self._base = 0  # bytes in the base file
        self._written: list[bytes] = []  # the base, then each part
        self._parts = (0, 0)  # (parts, bytes) after the base

    def repair(self) -> int:
        data, seq, base = read_whole(self.storage, self.name)
        keep = data.rfind(b"\n") + 1
        if keep < len(data) or base != len(data) or read_marker(self.storage, self.name) is None:
            compact(self.storage, self.name, data[:keep], seq)
        self._seq, self._base, self._parts = seq, keep, (0, 0)
        self._written = [data[:keep]]
        return len(data) - keep

    def append(self, data: bytes) -> None:
        """One object per flush: O(rows flushed), not O(rows so far). Compacted once the parts
        hold as much as the base (O(1) per row amortised) or are many."""
        self._seq += 1
        write_part(self.storage, self.name, self._seq, data)
        self._written.append(data)
        count, size = self._parts
        self._parts = count, size = count + 1, size + len(data)
        if size >= max(self._base, 1 << 16) or count >= MAX_PARTS:
            self.compact()

    def read(self) -> bytes:
        return b"".join(self._written)

    def count_lines(self) -> int:
        return sum(1 for line in self.read().splitlines() if line)

    def compact(self) -> None:
        """Fold the parts into the base file (at the end of fit(): one whole file, as readers
        without parts expect)."""
        if self._parts[0]:
            data = self.read()
            compact(self.storage, self.name, data, self._seq)
            self._written = [data]
            self._base, self._parts = len(data), (0, 0)

"""Sources: where a dataset's rows live, as a list of fragments that can be read piece by piece.

A :class:`Source` is light to pickle: file sources carry paths and row-group numbers, never rows.
:class:`TableSource` holds an in-memory table; when it is pickled for a worker process it is
written once to a shared-memory file (``/dev/shm`` where there is room) that every worker
memory-maps, instead of one copy of the rows per worker (small tables travel inline).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import tempfile
import threading
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from phalanx.data._plan import Piece
from phalanx.errors import ConfigError

__all__ = ["Source", "TableSource", "slice_stream"]

logger = logging.getLogger(__name__)

BLOCK_ROWS = 16384
"""In-memory tables are cut into blocks of this many rows: the unit of the per-epoch shuffle."""
INLINE_BYTES = 8 << 20
"""A worker's share of an in-memory table smaller than this is pickled with it, not shared."""


class Source(ABC):
    """Rows as fragments; ``read(piece)`` streams rows ``piece.start:piece.stop`` of a fragment."""

    schema: pa.Schema
    fragment_rows: np.ndarray  # int64, rows in each fragment
    private_buffers = True
    """Whether the batches read are fresh memory no one else sees (decoded from files), so
    tensors may share it; an in-memory table's rows belong to the user (or a read-only map)."""

    @property
    def num_rows(self) -> int:
        return int(self.fragment_rows.sum())

    def row_bytes(self) -> int:
        """About how many bytes a row takes in memory (to size reads)."""
        return estimate_row_bytes(self.schema)

    @abstractmethod
    def read(self, piece: Piece, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Record batches of at most ``batch_rows`` rows holding exactly the piece's rows."""

    @abstractmethod
    def subset(self, fragments: Sequence[int]) -> Source:
        """A source holding only ``fragments`` (renumbered 0..len-1, in that order)."""

    def restrict(self, pieces: Sequence[Piece]) -> tuple[Source, tuple[Piece, ...]]:
        """A source holding only what ``pieces`` read (distinct fragments), and the pieces
        renumbered for it: what a static shard ships to its worker."""
        local = tuple(Piece(i, p.start, p.stop) for i, p in enumerate(pieces))
        return self.subset([p.fragment for p in pieces]), local

    @abstractmethod
    def describe(self) -> str:
        """A short description for messages, e.g. ``3 parquet files under /data``."""


def estimate_row_bytes(schema: pa.Schema) -> int:
    """Fixed-width columns count their width; others (strings, lists) 32 bytes."""
    total = 0
    for field in schema:
        try:
            total += max(field.type.bit_width // 8, 1)
        except ValueError:  # not fixed-width
            total += 32
    return max(total, 1)


def slice_stream(
    batches: Iterator[pa.RecordBatch], start: int, stop: int
) -> Iterator[pa.RecordBatch]:
    """Rows ``[start, stop)`` of a stream of batches; stops reading once ``stop`` is reached."""
    offset = 0
    for batch in batches:
        n = batch.num_rows
        lo, hi = max(start - offset, 0), min(stop - offset, n)
        if hi > lo:
            yield batch if (lo, hi) == (0, n) else batch.slice(lo, hi - lo)
        offset += n
        if offset >= stop:
            return


class TableSource(Source):
    """An in-memory ``pyarrow.Table`` cut into blocks of rows (``blocks``: offset, length)."""

    private_buffers = False

    def __init__(
        self,
        table: pa.Table,
        blocks: np.ndarray | None = None,
        shared: _SharedFile | None = None,
    ) -> None:
        self.table = table
        self.schema = table.schema
        if blocks is None:
            offsets = np.arange(0, table.num_rows, BLOCK_ROWS, dtype=np.int64)
            lengths = np.minimum(BLOCK_ROWS, table.num_rows - offsets)
            blocks = np.stack([offsets, lengths], axis=1).reshape(-1, 2)
        self.blocks = np.asarray(blocks, dtype=np.int64).reshape(-1, 2)
        self.fragment_rows = self.blocks[:, 1]
        self._shared = shared or _SharedFile(table)

    def row_bytes(self) -> int:
        return max(int(self.table.nbytes) // max(self.table.num_rows, 1), 1)

    def read(self, piece: Piece, batch_rows: int) -> Iterator[pa.RecordBatch]:
        offset = int(self.blocks[piece.fragment, 0]) + piece.start
        yield from self.table.slice(offset, piece.num_rows).to_batches(max_chunksize=batch_rows)

    def subset(self, fragments: Sequence[int]) -> TableSource:
        return TableSource(self.table, self.blocks[list(fragments)], self._shared)

    def restrict(self, pieces: Sequence[Piece]) -> tuple[Source, tuple[Piece, ...]]:
        """Blocks cut to exactly the pieces' rows: an inline pickle carries no other rows."""
        blocks = np.array(
            [(self.blocks[p.fragment, 0] + p.start, p.num_rows) for p in pieces], dtype=np.int64
        ).reshape(-1, 2)
        local = tuple(Piece(i, 0, p.num_rows) for i, p in enumerate(pieces))
        return TableSource(self.table, blocks, self._shared), local

    def describe(self) -> str:
        return f"an in-memory table of {self.num_rows} rows"

    def __reduce__(self) -> tuple[Any, ...]:
        rows, total = self.num_rows, self.table.num_rows
        small = total == 0 or self.table.nbytes * rows / total <= INLINE_BYTES
        if small or not self._shared.possible():
            return _inline_table, (_ipc_bytes(self._compact()), self.fragment_rows)
        return _open_shared, (self._shared.path(), socket.gethostname(), self.blocks)

    def _compact(self) -> pa.Table:
        """Only this source's rows, in block order, to pickle them inline."""
        parts = [self.table.slice(int(o), int(n)) for o, n in self.blocks]
        return pa.concat_tables(parts) if parts else self.table.schema.empty_table()


def _ipc_bytes(table: pa.Table) -> pa.Buffer:
    """The table in Arrow's IPC format: only the rows of sliced buffers (pickle would send the
    whole parent buffer of every slice)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _inline_table(data: pa.Buffer, lengths: np.ndarray) -> TableSource:
    """Unpickle a compacted table, keeping its blocks (pieces refer to them by number)."""
    table = pa.ipc.open_stream(data).read_all()
    offsets = np.cumsum(lengths) - lengths
    return TableSource(table, np.stack([offsets, lengths], axis=1))


def _open_shared(path: str, host: str, blocks: np.ndarray) -> TableSource:
    """Unpickle in a worker: memory-map the driver's file (zero-copy; pages shared by workers)."""
    if host == socket.gethostname() and not os.path.exists(path):
        raise ConfigError(
            f"The in-memory dataset shared at {path} was removed before this worker opened it.\n"
            "The driver removes it once no DataIterator of that dataset is left on the driver.\n"
            "HINT: keep the DataIterator (or its Dataset) alive on the driver until every "
            "worker has received it."
        )
    if host != socket.gethostname():
        raise ConfigError(
            f"This worker (host {socket.gethostname()}) cannot open the in-memory dataset the "
            f"driver shared at {path} on host {host}.\nIn-memory datasets (DataFrames, tables, "
            "arrays) are shared through a file on the driver's machine.\nHINT: with workers on "
            "other machines, pass the data as files on shared storage (a path or URI) instead."
        )
    # The open map keeps the data readable after the driver removes the file.
    table = pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
    return TableSource(table, blocks)


class _SharedFile:
    """The driver's shared-memory copy of a table, written on first use, removed with its owner."""

    def __init__(self, table: pa.Table) -> None:
        self._table: pa.Table | None = table
        self._path: str | None = None
        self._lock = threading.Lock()

    def possible(self) -> bool:
        return self._table is not None and self._table.num_columns > 0

    def path(self) -> str:
        with self._lock:
            if self._path is None:
                assert self._table is not None
                self._path = _write_shared(self._table)
                weakref.finalize(self, _remove, self._path, os.getpid())
            return self._path


def _write_shared(table: pa.Table) -> str:
    path = os.path.join(_spill_dir(table.nbytes), f"{uuid.uuid4().hex}.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=BLOCK_ROWS * 4)
    logger.debug("Shared an in-memory dataset of %d bytes at %s", table.nbytes, path)
    return path


_spill_root: str | None = None
_spill_lock = threading.Lock()


def _spill_dir(nbytes: int) -> str:
    """This process's private folder for shared tables: in /dev/shm when it has room."""
    global _spill_root
    with _spill_lock:
        if _spill_root is None or not os.path.isdir(_spill_root):
            base = None
            if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
                usage = shutil.disk_usage("/dev/shm")
                base = "/dev/shm" if usage.free > 2 * nbytes + (256 << 20) else None
            _spill_root = tempfile.mkdtemp(prefix=f"phalanx-data-{os.getpid()}-", dir=base)
            atexit.register(_remove_tree, _spill_root, os.getpid())
        return _spill_root


def _remove(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # never from a forked child that inherited the finalizer
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _remove_tree(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)

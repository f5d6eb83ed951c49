"""Append-only files on a local filesystem: whole lines appended, a cut last line repaired."""

from __future__ import annotations

import os
from typing import Any

from phalanx._foundation.fs.access import storage_errors


class LocalLog:
    """One history file of a run on a local filesystem (see ``store.RunLog``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def repair(self) -> int:
        """A file cut mid-line by a crash: drop the partial last row, so that appended rows start
        on a line of their own (otherwise the first of them is lost with it)."""
        if not os.path.isfile(self.path):  # none yet (or not a regular file: leave it alone)
            return 0
        with open(self.path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            keep = _end_of_last_line(f, size)
            if keep < size:
                f.truncate(keep)
        return size - keep

    def append(self, data: bytes) -> None:
        append_whole(self.path, data, durable=False)

    def read(self) -> bytes:
        """Empty for a file that is not a regular one (a device would never end)."""
        if not os.path.isfile(self.path):
            return b""
        with storage_errors("read", self.path), open(self.path, "rb") as f:
            return f.read()

    def count_lines(self) -> int:
        """Streamed, never read whole (the file may not be a regular one)."""
        if not os.path.isfile(self.path):
            return 0
        with open(self.path, "rb") as f:
            return sum(1 for line in f if line.strip())

    def compact(self) -> None:
        """Appended in place: whole already."""


def append_whole(path: str, data: bytes, durable: bool) -> None:
    """Append whole lines or nothing: on an error (a full disk) the file is cut back to where it
    was, so the next append never follows half a line. ``durable``: fsynced, and a new file's
    name too."""
    with storage_errors("append to", path):
        created = durable and not os.path.exists(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
            except BaseException:
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        if created:  # the new file's name must survive a power loss too
            fsync_path(os.path.dirname(path))


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _end_of_last_line(f: Any, size: int, block: int = 65536) -> int:
    """The offset just after the file's last newline (0 if it has none)."""
    end = size
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        chunk = f.read(end - start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0

"""A toy third store, to prove that adding a store is one module: a filesystem (fsspec's
``memory://``) used as if it had no rename and no append.

Its rules differ from both shipped stores: parts are staged under ``.staging/`` as on the local
store, but the commit *copies* them to the final prefix (no rename) before the snapshot lists the
checkpoint; a history file is rewritten whole at every flush (no append, no parts); the run is
claimed with the object stores' lease. It is not registered: the suite names it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx._foundation.fs.access import copy_tree, private_log_dir, private_log_path
from phalanx._internal.storage.claim import Owner
from phalanx._internal.storage.commit_record import (
    CommitRecord,
    remove_commit_record,
    write_commit_record,
)
from phalanx._internal.storage.lease import Lease, lease_held
from phalanx._internal.storage.run_storage import (
    STAGING_DIR,
    RunStorage,
    merge_metadata,
    write_files,
)
from phalanx.errors import StorageError


@dataclass(frozen=True)
class NoRenameStore(RunStorage):
    """Stage, then copy into place; the snapshot entry is the commit."""

    def local_log_dir(self, create: bool = True) -> str:
        make = private_log_dir if create else private_log_path
        return make(self.name, self.run_uri)

    def stage_part(self, source: Any, dir_name: str, attempt: int, move: bool = False) -> None:
        copy_tree(
            source.filesystem, source.path, self.filesystem, self.staging_path(dir_name, attempt)
        )

    def mark_in_place(self, dir_name: str, attempt: int) -> None:
        pass

    def commit(
        self,
        dir_name: str,
        attempt: int,
        metadata: dict[str, Any] | None,
        extra_files: dict[str, bytes] | None = None,
        record: CommitRecord | None = None,
    ) -> str:
        fs, staged, final = (
            self.filesystem,
            self.staging_path(dir_name, attempt),
            self.path(dir_name),
        )
        if fs.exists(staged):
            for path in fs.find(staged):
                fs.pipe(final + path[len(staged) :], fs.cat(path))
        if not fs.exists(final):
            raise StorageError(f"Checkpoint {dir_name!r} has no files.\nHINT: stage a part first.")
        if metadata:
            merge_metadata(fs, final, metadata)
        write_files(fs, final, extra_files)
        if record is not None:  # last; the staged copy stays until then: it names a cut copy
            write_commit_record(self, record)
        if fs.exists(staged):
            fs.rm(staged, recursive=True)
        return final

    def delete_checkpoint(self, dir_name: str) -> None:
        remove_commit_record(self, dir_name)
        if self.filesystem.exists(self.path(dir_name)):
            self.filesystem.rm(self.path(dir_name), recursive=True)

    def remove_staging(self) -> None:
        if self.filesystem.exists(self.path(STAGING_DIR)):
            self.filesystem.rm(self.path(STAGING_DIR), recursive=True)

    def write_atomic(self, relative: str, data: bytes) -> None:
        self.filesystem.pipe(self.path(relative), data)  # one write of the whole object

    def append_durable(self, relative: str, data: bytes) -> None:
        raise StorageError("NoRenameStore cannot append.\nHINT: check `appends` first.")

    def open_log(self, relative: str) -> WholeFileLog:
        return WholeFileLog(self, relative)

    def read_log(self, relative: str) -> bytes:
        return self.read(relative) or b""

    def claim(self, owner: Owner, stale_s: float, settle_s: float) -> Lease:
        return Lease.take(self, owner, stale_s, settle_s)

    def claim_held(self) -> bool | None:
        return lease_held(self)


class WholeFileLog:
    """A log rewritten whole at every append: O(file) per flush, the simplest correct rule."""

    def __init__(self, store: NoRenameStore, name: str) -> None:
        self.store, self.name = store, name
        self.data = b""

    def repair(self) -> int:
        data = self.store.read_log(self.name)
        self.data = data[: data.rfind(b"\n") + 1]
        if len(self.data) < len(data):
            self.store.write_atomic(self.name, self.data)
        return len(data) - len(self.data)

    def append(self, data: bytes) -> None:
        self.store.write_atomic(self.name, self.data + data)
        self.data += data

    def read(self) -> bytes:
        return self.data

    def count_lines(self) -> int:
        return sum(1 for line in self.data.splitlines() if line)

    def compact(self) -> None:
        pass

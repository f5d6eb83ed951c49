"""What ``get_context().get_storage()`` returns: the run's location, as Ray's StorageContext.

A small frozen view for training functions: where the run lives and how checkpoint names map to
paths. It is not the driver's store (no commit, no claim), so nothing a training function does
with it can touch the run's bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phalanx._foundation.fs.paths import check_checkpoint_dir_name, default_checkpoint_dir_name
from phalanx._foundation.optional import require
from phalanx._internal.worker.session import require_session

if TYPE_CHECKING:
    import pyarrow.fs

    from phalanx._internal.storage.store import RunStore

SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"  # run_storage's name; read by Ray users


@dataclass(frozen=True)
class StorageContext:
    """The run's storage as a training function sees it (Ray's ``StorageContext`` names).

    ``storage_path`` is the storage root (as Ray's ``storage_fs_path``: without a URI scheme),
    ``experiment_dir_name`` the run's name, ``experiment_fs_path`` (also ``run_path``) the run
    directory, ``filesystem`` an fsspec filesystem and ``storage_filesystem`` a
    ``pyarrow.fs.FileSystem`` over it.

    Example::

        storage = phalanx.get_context().get_storage()
        path = storage.build_checkpoint_path_from_name("epoch_3")
        storage.filesystem.makedirs(path, exist_ok=True)
    """

    filesystem: Any
    storage_path: str
    experiment_dir_name: str
    local_run: bool  # the run directory is on this machine's filesystem

    @classmethod
    def of(cls, store: RunStore) -> StorageContext:
        return cls(store.filesystem, store.storage_path, store.name, store.local_path is not None)

    @property
    def storage_fs_path(self) -> str:
        return self.storage_path

    @property
    def experiment_fs_path(self) -> str:
        return f"{self.storage_path}/{self.experiment_dir_name}"

    @property
    def run_path(self) -> str:
        return self.experiment_fs_path

    @property
    def trial_dir_name(self) -> str:
        """Ray V1's trial directory: a phalanx run has one trial, the run directory itself."""
        return self.experiment_dir_name

    @property
    def trial_fs_path(self) -> str:
        return self.experiment_fs_path

    @property
    def checkpoint_manager_snapshot_path(self) -> str:
        return f"{self.experiment_fs_path}/{SNAPSHOT_FILE}"

    @property
    def storage_filesystem(self) -> pyarrow.fs.FileSystem:
        """A ``pyarrow.fs.FileSystem`` for ``storage_path`` (Ray's attribute)."""
        pafs = require("pyarrow.fs", "StorageContext.storage_filesystem")
        if self.local_run:
            return pafs.LocalFileSystem()
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.filesystem))

    def build_checkpoint_path_from_name(self, checkpoint_name: str) -> str:
        """Where the checkpoint ``checkpoint_name`` of this run lives: write a ``NO_UPLOAD``
        checkpoint there, then report it with that name."""
        return f"{self.experiment_fs_path}/{check_checkpoint_dir_name(checkpoint_name)}"

    def extract_checkpoint_dir_name_from_path(self, checkpoint_path: str) -> str:
        prefix = self.experiment_fs_path + "/"
        if not checkpoint_path.startswith(prefix):
            raise ValueError(
                f"Checkpoint path {checkpoint_path} is not under the experiment directory "
                f"{self.experiment_fs_path}.\nHINT: pass a path made by "
                "build_checkpoint_path_from_name()."
            )
        return checkpoint_path[len(prefix) :]

    def make_default_checkpoint_dir_name(self) -> str:
        """The name this rank's next ``report()`` gives a checkpoint passed without
        ``checkpoint_dir_name`` (call it in a training function). A ``NO_UPLOAD`` rank writes
        there so that other ranks' default-named parts join it."""
        session = require_session("get_context().get_storage().make_default_checkpoint_dir_name")
        return default_checkpoint_dir_name(session.next_round)

    def __str__(self) -> str:
        return (
            f"StorageContext<storage_fs_path={self.storage_path!r}, "
            f"experiment_dir_name={self.experiment_dir_name!r}>"
        )

"""How a reported checkpoint becomes this rank's part of its round, decided once.

``report(checkpoint=...)`` asks every question here, where the report enters the worker, before
the round is taken: which name the round commits, whether the checkpoint is on the local disk
(asked once), whether the user's directory may be moved or removed, which files go where and on
which thread. The answer is one value, a :data:`CheckpointPlan`; ``Session.report`` applies it
(``uploader.py`` stages what it says) and asks nothing again:

- :class:`InPlace`: ``NO_UPLOAD``, the files are the checkpoint already (a directory in the run);
- :class:`Stage`: staged now, on the training thread (``SYNC``; or a move within one filesystem,
  as fast as queuing it);
- :class:`Background`: staged by the upload thread (``ASYNC``), from the user's directory, or
  from a private one it was moved aside to (``move_aside``: the user's directory is free at once);
- :class:`StateJob`: ``save_state``'s private directory, staged once its background write is done;
- :class:`UserUpload`: ``checkpoint_upload_fn`` persists it (the name the round commits is known
  only once it returns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from phalanx._foundation.fs.access import is_local
from phalanx._foundation.fs.paths import check_checkpoint_dir_name, default_checkpoint_dir_name
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.state_writer import WriteJob, pending_write
from phalanx._internal.worker.uploader import (
    check_deletable,
    check_source,
    in_place_dir_name,
    same_device,
)
from phalanx.checkpoint import Checkpoint, CheckpointUploadMode

UploadFn = Callable[[Checkpoint, str], Checkpoint]


@dataclass(frozen=True)
class InPlace:
    dir_name: str


@dataclass(frozen=True)
class Stage:
    dir_name: str
    move: bool  # the user allowed their files to be moved (a rename, no copy)


@dataclass(frozen=True)
class Background:
    dir_name: str
    move_aside: bool  # the files are moved to a private directory first, staged from there


@dataclass(frozen=True)
class StateJob:
    dir_name: str
    job: WriteJob


@dataclass(frozen=True)
class UserUpload:
    dir_name: str  # the name offered to the function; the round commits the one it returns
    fn: UploadFn
    job: WriteJob | None  # a save_state checkpoint: the function reads its files once written
    remove_after: bool  # the user's local directory is removed once persisted


CheckpointPlan = InPlace | Stage | Background | StateJob | UserUpload


def plan_checkpoint(
    storage: RunStorage,
    checkpoint: Checkpoint,
    mode: CheckpointUploadMode,
    index: int,
    name: str | None = None,
    delete: bool | None = None,
    upload_fn: UploadFn | None = None,
) -> CheckpointPlan:
    """The plan for ``checkpoint`` reported as round ``index``; raises what the user must fix
    (a bad name, not a directory, a directory that must not be removed)."""
    if name is not None:
        check_checkpoint_dir_name(name)
    if mode is CheckpointUploadMode.NO_UPLOAD:
        return InPlace(in_place_dir_name(storage, checkpoint, name))
    local = is_local(checkpoint.filesystem)
    check_source(checkpoint, local)
    dir_name = name or default_checkpoint_dir_name(index)
    if delete is None:
        delete = mode.default_delete_local_checkpoint_after_upload()
    if delete and local:
        check_deletable(storage, checkpoint.path)
    job = pending_write(checkpoint.path)
    if upload_fn is not None:
        return UserUpload(dir_name, upload_fn, job, remove_after=delete and local)
    if job is not None:
        return StateJob(dir_name, job)
    if mode is CheckpointUploadMode.SYNC or (
        delete and local and same_device(checkpoint.path, storage)
    ):
        return Stage(dir_name, move=bool(delete))
    return Background(dir_name, move_aside=bool(delete and local))

"""Checkpoint: a handle to a directory on some filesystem. Its contents are the user's."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

from phalanx._foundation.checkpoint_files import PREPROCESSOR_FILE, RAY_PREPROCESSOR_KEY
from phalanx._foundation.fs.access import copy_tree, is_local, resolve_filesystem

__all__ = ["Checkpoint", "CheckpointUploadMode"]

METADATA_FILE = ".metadata.json"


class CheckpointUploadMode(enum.Enum):
    """How ``report()`` persists a checkpoint (Ray Train's ``checkpoint_upload_mode``).

    Example::

        phalanx.report(metrics, checkpoint=ckpt, checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
    """

    SYNC = "sync"  # persisted before report() returns
    ASYNC = "async"  # report() returns at once; persisted in the background, in order
    NO_UPLOAD = "no_upload"  # the checkpoint was written inside the run directory already

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """What ``delete_local_checkpoint_after_upload=None`` means: True for ASYNC only (Ray)."""
        return self is CheckpointUploadMode.ASYNC


class Checkpoint:
    """A directory of files on a filesystem (local, ``s3://``, ``memory://``, ...).

    Example::

        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), f"{d}/model.pt")
            phalanx.report({"loss": loss}, checkpoint=Checkpoint.from_directory(d))

        with result.checkpoint.as_directory() as d:
            model.load_state_dict(torch.load(f"{d}/model.pt"))
    """

    def __init__(self, path: str | os.PathLike[str], filesystem: Any = None) -> None:
        self.filesystem, self.path = resolve_filesystem(path, filesystem)

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint of a local directory. Nothing is copied."""
        return cls(os.path.abspath(os.fspath(path)))

    @classmethod
    def from_checkpoint(cls, other: Checkpoint) -> Checkpoint:
        """``other`` as this class (AIR's way to get e.g. an XGBoostCheckpoint from
        ``result.checkpoint``); nothing is copied."""
        return cls(other.path, other.filesystem)

    @property
    def _local(self) -> bool:
        return is_local(self.filesystem)

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy the checkpoint into local directory ``path`` (a new temp dir if None)."""
        target = os.fspath(path) if path is not None else _temp_checkpoint_dir()
        os.makedirs(target, exist_ok=True)
        copy_tree(self.filesystem, self.path, resolve_filesystem(target)[0], target)
        return target

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory with the checkpoint's files; treat it as read-only.

        A local checkpoint yields its own path (no copy); a remote one is downloaded to a
        temporary directory that is removed afterwards.
        """
        if self._local:
            yield self.path
            return
        target = self.to_directory()
        try:
            yield target
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def get_metadata(self) -> dict[str, Any]:
        path = f"{self.path}/{METADATA_FILE}"
        if not self.filesystem.exists(path):
            return {}
        with self.filesystem.open(path, "r") as f:
            return dict(json.load(f))

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        self.filesystem.makedirs(self.path, exist_ok=True)
        with self.filesystem.open(f"{self.path}/{METADATA_FILE}", "w") as f:
            json.dump(metadata, f)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    def get_preprocessor(self) -> Any:
        """The preprocessor saved in this checkpoint (by a trainer's ``preprocessor=`` or
        :meth:`set_preprocessor`; also one saved by Ray's framework checkpoints), or None.
        Loading it unpickles it: load only checkpoints you trust."""
        import pickle

        path = f"{self.path}/{PREPROCESSOR_FILE}"
        if self.filesystem.exists(path):
            with self.filesystem.open(path, "rb") as f:
                return pickle.load(f)
        saved = self.get_metadata().get(RAY_PREPROCESSOR_KEY)
        return None if saved is None else pickle.loads(bytes.fromhex(saved))

    def set_preprocessor(self, preprocessor: Any) -> None:
        """Save ``preprocessor`` (cloudpickled) in this checkpoint, where predictors find it."""
        import cloudpickle

        payload = cloudpickle.dumps(preprocessor)
        self.filesystem.makedirs(self.path, exist_ok=True)
        with self.filesystem.open(f"{self.path}/{PREPROCESSOR_FILE}", "wb") as f:
            f.write(payload)

    def __repr__(self) -> str:
        protocol = self.filesystem.protocol
        scheme = protocol[0] if isinstance(protocol, tuple | list) else protocol
        where = self.path if self._local else f"{scheme}://{self.path}"
        return f"Checkpoint(path={where!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Checkpoint)
            and self.path == other.path
            and type(self.filesystem) is type(other.filesystem)
        )

    def __hash__(self) -> int:
        return hash((self.path, type(self.filesystem)))

    def __fspath__(self) -> str:
        raise TypeError(
            "A Checkpoint is not a path. HINT: use `with checkpoint.as_directory() as d:` "
            "or `checkpoint.path`."
        )


def _temp_checkpoint_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"checkpoint_tmp_{uuid.uuid4().hex}")

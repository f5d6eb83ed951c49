"""Resolve storage paths to a filesystem, and the few file operations phalanx needs.

Everything goes through fsspec; the local filesystem gets fast paths (a rename where the user
allows their files to be moved, a reflink or in-kernel copy otherwise: see ``copy.py``).
A ``pyarrow.fs.FileSystem`` given by the user is wrapped with fsspec's ``ArrowFSWrapper``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from phalanx._foundation import env
from phalanx._foundation.fs import copy as local_copy
from phalanx._foundation.fs.syncfs import rename_no_replace
from phalanx.errors import StorageError

__all__ = [
    "copy_tree",
    "is_local",
    "move_tree_contents",
    "private_log_dir",
    "private_log_path",
    "resolve_filesystem",
    "storage_error",
    "storage_errors",
]


def resolve_filesystem(path: str | os.PathLike[str], filesystem: object = None) -> tuple[Any, str]:
    """Return ``(fsspec filesystem, path within it)`` for a local path or a URI."""
    import fsspec  # imported on first use: `import phalanx` stays light (issue 19)

    path = os.fspath(path)
    if filesystem is not None:
        fs = _as_fsspec(filesystem)
        return fs, fs._strip_protocol(path) if "://" in path else path
    if "://" not in path or path.startswith("file://"):
        local = path.removeprefix("file://")
        return fsspec.filesystem("file"), os.path.abspath(os.path.expanduser(local))
    fs, stripped = fsspec.core.url_to_fs(path)
    return fs, stripped


def _as_fsspec(filesystem: object) -> Any:
    import fsspec

    if isinstance(filesystem, fsspec.AbstractFileSystem):
        return filesystem
    if type(filesystem).__module__.startswith("pyarrow"):  # pyarrow itself is optional
        import pyarrow.fs as pafs

        if isinstance(filesystem, pafs.FileSystem):
            from fsspec.implementations.arrow import ArrowFSWrapper

            return ArrowFSWrapper(filesystem)
    raise TypeError(
        f"storage_filesystem must be an fsspec or pyarrow filesystem, got {type(filesystem)!r}"
    )


def is_local(fs: object) -> bool:
    # Until fsspec's local filesystem is imported, nothing can be one of its instances.
    local = sys.modules.get("fsspec.implementations.local")
    return local is not None and isinstance(fs, local.LocalFileSystem)


def move_tree_contents(src: str, dst: str) -> None:
    """Move every entry of local directory ``src`` into ``dst`` (merging directories).

    ``src`` itself stays (empty), so a ``tempfile.TemporaryDirectory`` around it still cleans up.
    Same filesystem: each entry is one rename, no data is copied.
    """
    os.makedirs(dst, exist_ok=True)
    for entry in list(os.scandir(src)):  # list(): closed at once, even if the loop raises
        target = os.path.join(dst, entry.name)
        if entry.is_dir(follow_symlinks=False) and os.path.isdir(target):
            move_tree_contents(entry.path, target)
            os.rmdir(entry.path)
            continue
        try:
            # A directory never replaces one another rank created meanwhile (maybe still empty)
            if not (entry.is_dir(follow_symlinks=False) and rename_no_replace(entry.path, target)):
                os.replace(entry.path, target)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and os.path.isdir(target):
                # another rank moved a directory of the same name there first: merge into it
                move_tree_contents(entry.path, target)
                os.rmdir(entry.path)
                continue
            if exc.errno != errno.EXDEV:  # another device: fall back to a copy
                raise
            if entry.is_dir(follow_symlinks=False):
                local_copy.copy_tree(entry.path, target)
                shutil.rmtree(entry.path)
            else:
                local_copy.copy_file(entry.path, target)
                os.unlink(entry.path)


def copy_tree(src_fs: Any, src: str, dst_fs: Any, dst: str) -> None:
    """Copy a directory tree between any two filesystems."""
    if is_local(src_fs) and is_local(dst_fs):
        local_copy.copy_tree(src, dst)
        return
    if is_local(src_fs):
        dst_fs.makedirs(dst, exist_ok=True)
        dst_fs.put(src.rstrip("/") + "/", dst.rstrip("/") + "/", recursive=True)
        return
    if is_local(dst_fs):
        os.makedirs(dst, exist_ok=True)
        src_fs.get(src.rstrip("/") + "/", dst.rstrip("/") + "/", recursive=True)
        return
    for path in src_fs.find(src):
        rel = os.path.relpath(path, src)
        with src_fs.open(path, "rb") as fin, dst_fs.open(f"{dst}/{rel}", "wb") as fout:
            shutil.copyfileobj(fin, fout, 16 << 20)


# -- errors -------------------------------------------------------------------------------------

# The phalanx extra that installs fsspec's filesystem for a storage_path protocol.
_PROTOCOL_EXTRAS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "abfs": "azure",
    "abfss": "azure",
    "az": "azure",
}
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_CREDENTIAL_WORDS = (
    "Credential",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "RefreshError",
)


@contextlib.contextmanager
def storage_errors(action: str, path: str) -> Iterator[None]:
    """Turn any failure of the storage inside the block into a StorageError naming ``path``.

    Filesystems raise OSError, but also their SDK's own errors (botocore's NoCredentialsError,
    EndpointConnectionError, ...): every one of them is a storage failure for the user.
    """
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        raise storage_error(action, path, exc) from exc


def storage_error(action: str, path: str, exc: BaseException) -> StorageError:
    """What phalanx was doing, where, the cause, and a HINT chosen by the cause."""
    return StorageError(
        f"Could not {action} {path!r}: {type(exc).__name__}: {exc}\nHINT: {_hint(exc, path)}"
    )


def _hint(exc: BaseException, path: str) -> str:
    names = " ".join(t.__name__ for t in type(exc).__mro__) + " " + str(exc)
    code = getattr(exc, "errno", None)
    if code in _NO_SPACE:
        return (
            f"the filesystem holding {path!r} is full (or over its quota): free space there, "
            "keep fewer checkpoints (CheckpointConfig(num_to_keep=...)) or pick another "
            "RunConfig(storage_path=...)."
        )
    if any(word in names for word in _CREDENTIAL_WORDS):
        return (
            "no valid credentials for this storage: set them for its SDK (for S3: "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance role), or pass "
            "RunConfig(storage_filesystem=...) built with credentials."
        )
    if isinstance(exc, PermissionError) or code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            "permission denied: check that you (or your credentials) may write there, or pick "
            "another RunConfig(storage_path=...)."
        )
    if isinstance(exc, ImportError):
        extra = _PROTOCOL_EXTRAS.get(path.split("://", 1)[0] if "://" in path else "")
        if extra is not None:
            return f'pip install "phalanx[{extra}]" (the filesystem package for this protocol).'
        return "install the package this protocol needs (named above), e.g. pip install s3fs."
    if isinstance(exc, ConnectionError | TimeoutError) or "Connect" in names:
        return "the storage service cannot be reached: check its endpoint URL and the network."
    if isinstance(exc, FileNotFoundError):
        return "check that the bucket or parent directory exists and is spelled right."
    return "pick a storage_path that is reachable and writable (RunConfig(storage_path=...))."


# -- private directories ------------------------------------------------------------------------

_private_dirs: dict[str, str] = {}


def private_log_dir(name: str, run_uri: str) -> str:
    """A directory only this user can use, for the rank logs of a run on remote storage.

    ``<user cache>/phalanx/logs/<name>-<hash of the run URI>`` (mode 0700; stable, so a resumed
    run appends to the same logs). Never a fixed shared path such as ``/tmp/phalanx_logs/<name>``,
    which another local user could pre-create (a symlink) to make the run write into their
    target. When the cache path is not a plain directory of ours, a fresh ``mkdtemp`` is used.
    """
    if run_uri in _private_dirs:
        return _private_dirs[run_uri]
    path = private_log_path(name, run_uri)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        if not _is_private_dir(path):
            path = tempfile.mkdtemp(prefix=f"phalanx_logs_{name}_")
    except OSError:  # no writable home (a container): a private temporary directory
        path = tempfile.mkdtemp(prefix=f"phalanx_logs_{name}_")
    _private_dirs[run_uri] = path
    return path


def private_log_path(name: str, run_uri: str) -> str:
    """Where :func:`private_log_dir` puts a run's logs (nothing is created: for readers)."""
    digest = hashlib.sha256(run_uri.encode()).hexdigest()[:12]
    return os.path.join(env.user_cache_dir(), "phalanx", "logs", f"{name}-{digest}")


def _is_private_dir(path: str) -> bool:
    info = os.lstat(path)  # lstat: a symlink is not ours, whatever it points to
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077

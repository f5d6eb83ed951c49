"""Resolve storage paths to a filesystem, and the few file operations phalanx needs.

Everything goes through fsspec; the local filesystem gets fast paths (rename instead of copy).
A ``pyarrow.fs.FileSystem`` given by the user is wrapped with fsspec's ``ArrowFSWrapper``.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = ["copy_tree", "is_local", "move_tree_contents", "resolve_filesystem"]


def resolve_filesystem(path: str | os.PathLike[str], filesystem: Any = None) -> tuple[Any, str]:
    """Return ``(fsspec filesystem, path within it)`` for a local path or a URI."""
    path = os.fspath(path)
    if filesystem is not None:
        fs = _as_fsspec(filesystem)
        return fs, fs._strip_protocol(path) if "://" in path else path
    if "://" not in path or path.startswith("file://"):
        local = path.removeprefix("file://")
        return fsspec.filesystem("file"), os.path.abspath(os.path.expanduser(local))
    fs, stripped = fsspec.core.url_to_fs(path)
    return fs, stripped


def _as_fsspec(filesystem: Any) -> Any:
    if isinstance(filesystem, fsspec.AbstractFileSystem):
        return filesystem
    try:
        import pyarrow.fs as pafs

        if isinstance(filesystem, pafs.FileSystem):
            from fsspec.implementations.arrow import ArrowFSWrapper

            return ArrowFSWrapper(filesystem)
    except ImportError:  # pragma: no cover - pyarrow is a core dependency
        pass
    raise TypeError(
        f"storage_filesystem must be an fsspec or pyarrow filesystem, got {type(filesystem)!r}"
    )


def is_local(fs: Any) -> bool:
    return isinstance(fs, LocalFileSystem)


def move_tree_contents(src: str, dst: str) -> None:
    """Move every entry of local directory ``src`` into ``dst`` (merging directories).

    ``src`` itself stays (empty), so a ``tempfile.TemporaryDirectory`` around it still cleans up.
    Same filesystem: each entry is one rename, no data is copied.
    """
    os.makedirs(dst, exist_ok=True)
    for entry in os.scandir(src):
        target = os.path.join(dst, entry.name)
        if entry.is_dir(follow_symlinks=False) and os.path.isdir(target):
            move_tree_contents(entry.path, target)
            os.rmdir(entry.path)
            continue
        try:
            os.replace(entry.path, target)
        except OSError as exc:
            if exc.errno != 18:  # EXDEV: another device, fall back to a copy
                raise
            if entry.is_dir(follow_symlinks=False):
                shutil.copytree(entry.path, target, dirs_exist_ok=True)
                shutil.rmtree(entry.path)
            else:
                shutil.copy2(entry.path, target)
                os.unlink(entry.path)


def copy_tree(src_fs: Any, src: str, dst_fs: Any, dst: str) -> None:
    """Copy a directory tree between any two filesystems."""
    if is_local(src_fs) and is_local(dst_fs):
        shutil.copytree(src, dst, dirs_exist_ok=True)
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
